"""DeepSpeed: the JSON config of the plan (``deepspeed.initialize(config=...)``).

``train_batch_size`` = ``train_micro_batch_size_per_gpu`` x ``gradient_accumulation_steps`` x data
parallel ranks (DeepSpeed's own check), ``zero_optimization.stage``, ``bf16``/``fp16``,
``activation_checkpointing`` (every block, ``pipeline.activation_checkpoint_interval`` 1 under its
pipeline engine), ``pipeline`` (stages; ``partition`` by the block type, DeepSpeed's even split of the
blocks) and ``tensor_parallel.autotp_size``. JSON has no comments: ``autopar_export`` holds the header
(source, exact or the changes, predicted step times); DeepSpeed ignores the key.
"""

from __future__ import annotations

import json

from autopar.export.common import Export

# PipelineModule partition_method "type:<regex>": the block classes (balanced by count: an even split of the blocks).
BLOCK_TYPE = "DecoderLayer|TransformerLayer|Block"


def config(ex: Export) -> dict:
    """The DeepSpeed config dict of the export."""
    s = ex.shape
    cfg: dict = {
        "autopar_export": ex.header_lines() + _notes(ex),
        "train_batch_size": ex.plan.global_batch_size,
        "train_micro_batch_size_per_gpu": ex.micro_batch_per_rank,
        "gradient_accumulation_steps": s.num_microbatches,
        "zero_optimization": {"stage": s.zero},
        "gradient_clipping": 1.0,
    }
    if ex.plan.precision in ("bf16", "fp16"):
        cfg[ex.plan.precision] = {"enabled": True}
    if s.ckpt == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    if s.pp > 1:
        cfg["pipeline"] = {"stages": s.pp, "partition": "type:" + BLOCK_TYPE,
                           "activation_checkpoint_interval": 1 if s.ckpt == "full" else 0}
    if s.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": s.tp}
    return cfg



def _notes(ex: Export) -> list[str]:
    """What the training script does that a DeepSpeed config cannot (checkpointing and TP outside its pipeline)."""
    out = []
    if ex.shape.ckpt == "full" and ex.shape.pp == 1:
        out.append("activation checkpointing of every block: the model calls deepspeed.checkpointing.checkpoint "
                   "(Hugging Face: gradient_checkpointing_enable())")
    if ex.shape.pp > 1:
        out.append(f"pipeline: PipelineModule(num_stages={ex.shape.pp}, partition_method=\"type:{BLOCK_TYPE}\")")
    return out


def render(ex: Export) -> str:
    """The config as JSON text."""
    return json.dumps(config(ex), indent=2) + "\n"
