"""torchtitan 0.3: the launch script of ``python -m torchtitan.train`` with the plan as config overrides.

torchtitan 0.3 reads no job file: ``torchtitan.config.ConfigManager`` takes ``--module``/``--config``
(a config_registry function, which defines the model) and tyro overrides ``--<section>.<field>``.
The script holds those overrides in the bash array ``ARGS`` (an option and its values a line): parallelism degrees (``data_parallel_replicate_degree`` x ``data_parallel_shard_degree``
x ``tensor_parallel_degree`` x ``pipeline_parallel_degree``, torchtitan's mesh order pp, replicate,
shard, tp = the plan's rank order), FSDP resharding (ZeRO-3 ``always``, with ``reshard: false``
``never``), sequence
parallel (with async TP: ``compile.enable`` and ``compile.enable_async_tensor_parallel``), the pipeline schedule, micro-batch and per-stage modules, the activation checkpoint
subcommand and the batch, sequence and parameter dtype; for an MoE model with ep > 1
``--parallelism.expert_parallel_degree`` (ranks borrowed from FSDP's dp_shard, so with ZeRO-2/3 only).
"""

from __future__ import annotations

from autopar.export.common import Export, bash_array, printable

# autopar zoo -> torchtitan config_registry (module, function); other models name theirs by TT_MODULE/TT_CONFIG.
REGISTRY = {"llama3-8b": ("llama3", "llama3_8b"), "llama3-70b": ("llama3", "llama3_70b"),
            "llama3-405b": ("llama3", "llama3_405b")}
FQNS = {"embed": ["tok_embeddings"], "head": ["norm", "output"]}  # autopar unit -> torchtitan llama modules
AC = {"none": "none", "op": "selective", "full": "full"}
SCHEDULE = {"1f1b": "1F1B", "gpipe": "GPipe"}
DTYPE = {"bf16": "bfloat16", "fp32": "float32"}


def args(ex: Export) -> list[str]:
    """The ConfigManager overrides of the export (without ``--module``/``--config``)."""
    s, dp, gbs = ex.shape, ex.dp, ex.plan.global_batch_size
    ranks = dp * s.replicas
    shard = dp if s.zero == 3 else 1
    out = ["--parallelism.data_parallel_replicate_degree", str(ranks // shard),
           "--parallelism.data_parallel_shard_degree", str(shard),
           "--parallelism.tensor_parallel_degree", str(s.tp),
           "--parallelism.pipeline_parallel_degree", str(s.pp)]
    if s.cp > 1:
        out += ["--parallelism.context_parallel_degree", str(s.cp)]
    if shard > 1:
        out += ["--parallelism.fsdp_reshard_after_forward", "always" if s.reshard else "never"]
    if s.ep > 1:
        out += ["--parallelism.expert_parallel_degree", str(s.ep)]
    if s.tp > 1:
        out += ["--parallelism.enable_sequence_parallel" if s.sp else "--parallelism.no-enable_sequence_parallel"]
    if s.async_tp:  # torchtitan refuses async TP without compiling the model (CompileConfig.__post_init__)
        out += ["--compile.enable", "--compile.enable_async_tensor_parallel"]
    if s.pp > 1:
        parts = [[f for i in stage for f in FQNS.get(ex.units[i], [ex.units[i]])] for stage in s.split]
        out += ["--parallelism.pipeline_parallel_schedule", SCHEDULE[ex.plan.schedule],
                "--parallelism.pipeline_parallel_microbatch_size", str(ex.micro_batch_per_rank),
                "--parallelism.module_fqns_per_model_part", *[",".join(p) for p in parts],
                "--training.local_batch_size", str(gbs // ranks),
                "--training.disable_cuda_graphs"]
    else:  # gradient accumulation: one micro-batch per step of the loop
        out += ["--training.local_batch_size", str(ex.micro_batch_per_rank)]
    out += ["--training.global_batch_size", str(gbs), "--training.seq_len", str(ex.model.seq_len),
            "--training.mixed_precision_param", DTYPE[ex.plan.precision],
            f"activation_checkpoint:{AC[s.ckpt]}"]
    return out


def render(ex: Export) -> str:
    """The launch script (bash) for every node: torchrun of torchtitan.train with ``args``."""
    module, config = REGISTRY.get(ex.model.name, (None, None))
    nodes, _ = ex.launch_shape()
    lines = ["#!/usr/bin/env bash"] + [f"# {h}" for h in ex.header_lines()]
    lines += ["# torchtitan 0.3 takes no job file: ConfigManager reads --module/--config (the model) and these",
              "# overrides. Run on every node with NODE_RANK and MASTER_ADDR set (torchrun rendezvous).",
              "set -euo pipefail"]
    if module is None:
        lines += [printable(f"# {ex.model.name} has no torchtitan config_registry entry: name yours (a function that "
                            "builds the same model) in TT_MODULE and TT_CONFIG."),
                  'MODULE="${TT_MODULE:?set TT_MODULE and TT_CONFIG to the torchtitan config of this model}"',
                  'CONFIG="${TT_CONFIG:?set TT_CONFIG to the torchtitan config of this model}"']
    else:
        lines += [f'MODULE="${{TT_MODULE:-{module}}}"', f'CONFIG="${{TT_CONFIG:-{config}}}"']
    lines += bash_array(args(ex)) + ex.torchrun()
    lines += [f'exec torchrun --nnodes={nodes} --nproc-per-node="$NPROC" '
              '--node-rank="${NODE_RANK:-0}" --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR:-localhost}:'
              '${MASTER_PORT:-29500}" -m torchtitan.train --module "$MODULE" --config "$CONFIG" "${ARGS[@]}" "$@"',
              ""]
    return "\n".join(lines)

