"""Megatron-LM: the ``pretrain_gpt.py`` arguments of the plan, in a launch script.

Uniform ``--tensor-model-parallel-size`` / ``--pipeline-model-parallel-size`` (Megatron's rank order:
TP fastest, then data parallel, pipeline slowest = the plan's), ``--sequence-parallel``, ZeRO-1 as
``--use-distributed-optimizer``, ZeRO-2/3 as Megatron-FSDP (``--use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads[_params]``), ``zero_overlap`` as ``--overlap-grad-reduce
--overlap-param-gather``, ``--recompute-granularity selective`` (the
attention core) or ``full`` (``--recompute-method uniform --recompute-num-layers 1``), the micro and
global batch, the model's shape, and with pipelining ``--pipeline-model-parallel-layout`` (the stages'
units: ``E`` embedding, ``t`` block, ``L`` loss; ``|`` between stages). An MoE model adds its experts
(``moe_args``: ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``, shared experts,
``--moe-layer-freq`` where some blocks are dense; TransformerConfig's ``num_moe_experts``,
``moe_router_topk``) and, with ep > 1, ``--expert-model-parallel-size`` (``expert_model_parallel_size``)
with the all-to-all dispatcher; routing stays dropless (no ``--moe-expert-capacity-factor``), as autopar
plans and runs it.
The arguments are the bash array ``ARGS`` (an option and its values a line).
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.export.common import Export, bash_array

PRECISION = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": []}
FSDP = {2: "optim_grads", 3: "optim_grads_params"}


def layout(ex: Export) -> str:
    """The ``--pipeline-model-parallel-layout`` string of the export's split."""
    letter = {"embedding": "E", "block": "t", "head": "L"}
    kinds = {ly.name: ly.kind for ly in ex.model.layers}
    return "|".join("".join(letter.get(kinds[ex.units[i]], "t") for i in stage) for stage in ex.shape.split)


def moe_args(ex: Export) -> list[str]:
    """The MoE arguments of the export's model (empty for a dense model)."""
    m = ex.model
    moes = [ly.moe for ly in m.layers if ly.moe is not None]
    if not moes:
        return []
    first = moes[0]
    width = round(first.params_per_expert / (3 * m.hidden))  # SwiGLU experts: 3 x hidden x width
    blocks = [ly for ly in m.layers if ly.kind == "block"]
    out = ["--num-experts", str(first.num_experts), "--moe-router-topk", str(first.top_k),
           "--moe-ffn-hidden-size", str(width), "--moe-grouped-gemm", "--moe-router-load-balancing-type", "aux_loss"]
    if m.meta.get("shared_ffn"):
        out += ["--moe-shared-expert-intermediate-size", str(m.meta["shared_ffn"])]
    if any(ly.moe is None for ly in blocks):
        out += ["--moe-layer-freq", "[" + ",".join("1" if ly.moe else "0" for ly in blocks) + "]"]
    if ex.shape.ep > 1:
        out += ["--expert-model-parallel-size", str(ex.shape.ep), "--moe-token-dispatcher-type", "alltoall"]
    return out


def args(ex: Export) -> list[str]:
    """The Megatron-LM arguments of the export; AutoparError for a model without a transformer's shape."""
    s, m = ex.shape, ex.model
    if not (m.hidden and m.num_heads):
        raise AutoparError("export --to megatron", f"model {m.name!r} has no transformer shape (hidden size, "
                           "attention heads) for pretrain_gpt.py", "export it to deepspeed or accelerate")
    blocks = sum(1 for ly in m.layers if ly.kind == "block") or m.num_layers
    out = ["--tensor-model-parallel-size", str(s.tp), "--pipeline-model-parallel-size", str(s.pp)]
    if s.cp > 1:
        out += ["--context-parallel-size", str(s.cp)]
    if s.sp:
        out.append("--sequence-parallel")
    if s.async_tp:  # Transformer Engine's userbuffers: TP all-gather / reduce-scatter overlapped with the GEMMs
        out.append("--tp-comm-overlap")
    if s.zero == 1:
        out.append("--use-distributed-optimizer")
    elif s.zero in FSDP:
        out += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP[s.zero]]
    if s.overlap:  # zero_overlap (ZeRO-1/2): Megatron takes the param gather overlap only with the grad one
        out += ["--overlap-grad-reduce", "--overlap-param-gather"]
    if s.ckpt == "selective":
        out += ["--recompute-granularity", "selective"]
    elif s.ckpt == "full":
        out += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if s.pp > 1:  # explicit: Megatron's own split needs the blocks to divide evenly
        out += ["--pipeline-model-parallel-layout", layout(ex)]
    out += ["--micro-batch-size", str(ex.micro_batch_per_rank), "--global-batch-size", str(ex.plan.global_batch_size),
            "--seq-length", str(m.seq_len), "--max-position-embeddings", str(m.seq_len),
            "--num-layers", str(blocks), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.num_heads)]
    if m.ffn:
        out += ["--ffn-hidden-size", str(m.ffn)]
    if m.num_kv_heads and m.num_kv_heads != m.num_heads:
        out += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    return out + moe_args(ex) + PRECISION[ex.plan.precision]


def render(ex: Export) -> str:
    """The launch script (bash): torchrun of Megatron-LM's pretrain_gpt.py with ``args`` per node."""
    nodes, _ = ex.launch_shape()
    lines = ["#!/usr/bin/env bash"] + [f"# {h}" for h in ex.header_lines()]
    lines += ["# Megatron-LM arguments; data, tokenizer, optimizer and schedule arguments go after them (\"$@\").",
              "# Run on every node with NODE_RANK and MASTER_ADDR set; MEGATRON: your Megatron-LM checkout.",
              "set -euo pipefail"]
    lines += bash_array(args(ex)) + ex.torchrun()
    lines += [f'exec torchrun --nnodes={nodes} --nproc-per-node="$NPROC" '
              '--node-rank="${NODE_RANK:-0}" --master-addr="${MASTER_ADDR:-localhost}" '
              '--master-port="${MASTER_PORT:-29500}" "${MEGATRON:-.}/pretrain_gpt.py" "${ARGS[@]}" "$@"', ""]
    return "\n".join(lines)

