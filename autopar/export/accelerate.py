"""accelerate: the ``accelerate launch --config_file`` YAML of the plan (FSDP).

``distributed_type: FSDP`` with ``fsdp_sharding_strategy`` and ``fsdp_reshard_after_forward`` (the same
FSDP1 strategy under both names: accelerate 1.x deprecates the first for the second, and its launcher still
hands the first to the FSDP1 plugin) FULL_SHARD (ZeRO-3), SHARD_GRAD_OP (ZeRO-3 with ``reshard: false``)
or NO_SHARD (ZeRO-0), transformer-block wrapping, ``fsdp_activation_checkpointing`` (full
checkpointing of the blocks), ``mixed_precision`` and the process counts. accelerate's config has no
batch fields: the header gives the per-device micro-batch and the gradient accumulation steps the
script must use (``Accelerator(gradient_accumulation_steps=...)``).
"""

from __future__ import annotations

import yaml

from autopar.export.common import Export

SHARDING = {(3, True): "FULL_SHARD", (3, False): "SHARD_GRAD_OP", (0, True): "NO_SHARD"}  # (zero, reshard)
PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def config(ex: Export) -> dict:
    """The accelerate config dict of the export."""
    nodes, _ = ex.launch_shape()
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": PRECISION[ex.plan.precision],
        "num_machines": nodes,
        "num_processes": ex.world,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "fsdp_config": {
            "fsdp_version": 1,
            "fsdp_sharding_strategy": SHARDING[ex.shape.zero, ex.shape.reshard],
            "fsdp_reshard_after_forward": SHARDING[ex.shape.zero, ex.shape.reshard],
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_offload_params": False,
            "fsdp_use_orig_params": True,
            "fsdp_activation_checkpointing": ex.shape.ckpt == "full",
        },
    }


def render(ex: Export) -> str:
    """The config as YAML with the header as comments."""
    head = ex.header_lines() + [
        f"batch: {ex.micro_batch_per_rank} samples per device per micro-batch, gradient_accumulation_steps "
        f"{ex.shape.num_microbatches}, global batch {ex.plan.global_batch_size}: set them in the training script",
        "machine_rank: 0 here; each node launches with its own --machine_rank"]
    return "".join(f"# {h}\n" for h in head) + yaml.safe_dump(config(ex), sort_keys=False)
