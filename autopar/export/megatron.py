"""Megatron-LM: the ``pretrain_gpt.py`` arguments of the plan, in a launch script.

Uniform ``--tensor-model-parallel-size`` / ``--pipeline-model-parallel-size`` (Megatron's rank order:
TP fastest, then data parallel, pipeline slowest = the plan's), ``--sequence-parallel``, ZeRO-1 as
``--use-distributed-optimizer``, ZeRO-2/3 as Megatron-FSDP (``--use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads[_params]``), ``zero_overlap`` as ``--overlap-grad-reduce
--overlap-param-gather``, ``--recompute-granularity selective`` (the
attention core) or ``full`` (``--recompute-method uniform --recompute-num-layers 1``), the micro and
global batch, the model's shape and architecture (``ARCHITECTURE``: norm, MLP, rotary positions and base, untied
embeddings, biases, head width, dropout, latent attention; refused for what pretrain_gpt.py does not build),
and with pipelining ``--pipeline-model-parallel-layout`` (the stages'
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
# pretrain_gpt.py's model arguments beyond the shape, as Megatron-LM's own scripts spell them
# (NVIDIA/Megatron-LM @ d98e8a64: examples/llama/train_llama3_8b_h100_fp8.sh, examples/megatron_fsdp/
# sbatch_mfsdp_deepseek_v3.sh, examples/multimodal/nvlm/pretrain_qwen20_72b_internvit_6b.sh): what a model
# spec's meta says -> the arguments. Megatron's defaults are GPT's: LayerNorm, GeLU, learned positions, tied
# embeddings, biased linears, dropout 0.1.
ARCHITECTURE = [
    (lambda a: a.get("norm") == "rms", lambda a: ["--normalization", "RMSNorm"]),
    (lambda a: a.get("mlp") == "swiglu", lambda a: ["--swiglu"]),
    (lambda a: a.get("pos") == "rope", lambda a: ["--position-embedding-type", "rope"]),
    (lambda a: a.get("pos") == "rope" and a.get("rope_theta"), lambda a: ["--rotary-base", str(int(a["rope_theta"]))]),
    (lambda a: (a.get("rope_scaling") or {}).get("type") == "llama3",
     lambda a: ["--use-rope-scaling", "--rope-scaling-factor", str(a["rope_scaling"].get("factor") or 8.0)]),
    (lambda a: not a.get("tied_embeddings"), lambda a: ["--untie-embeddings-and-output-weights"]),
    (lambda a: not a.get("bias"), lambda a: ["--disable-bias-linear"]),
    (lambda a: a.get("qkv_bias"), lambda a: ["--add-qkv-bias"]),
    (lambda a: a.get("head_dim"), lambda a: ["--kv-channels", str(a["head_dim"])]),
    (lambda a: not a.get("dropout"), lambda a: ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]),
    (lambda a: a.get("kv_lora"), lambda a: ["--multi-latent-attention", "--kv-lora-rank", str(a["kv_lora"]),
                                            "--qk-head-dim", str(a["qk_nope"]), "--qk-pos-emb-head-dim",
                                            str(a["qk_rope"]), "--v-head-dim", str(a["v_head"])]
                                           + (["--q-lora-rank", str(a["q_lora"])] if a.get("q_lora") else [])),
    (lambda a: a.get("qk_norm") or a.get("kv_lora"), lambda a: ["--qk-layernorm"]),  # MLA: its latents' norms
]
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


def architecture(ex: Export) -> list[str]:
    """The model arguments of ``ARCHITECTURE``; nothing for a traced model (its spec states its shape, not its
    layers' kinds); AutoparError for what pretrain_gpt.py does not build (it would train another model)."""
    a, name = ex.model.meta, ex.model.name
    if "norm" not in a:
        return []
    refuse = ("encoder or image model: pretrain_gpt.py builds causal decoders" if a.get("arch") != "decoder" else
              "Gemma's GeGLU, embedding scale and sublayer-output norms" if str(a.get("family")).startswith("gemma")
              or a.get("block_norms", 2) != 2 else
              f"rope scaling {a['rope_scaling']['type']!r}" if a.get("rope_scaling")
              and a["rope_scaling"].get("type") != "llama3" else
              "biases on the attention or the MLP alone" if a.get("attn_bias") or a.get("mlp_bias") else "")
    if refuse:
        raise AutoparError("export --to megatron", f"model {name!r}: {refuse} has no pretrain_gpt.py argument "
                           "autopar writes", "export it to deepspeed or accelerate (they run the model as it is)")
    return [arg for when, then in ARCHITECTURE if when(a) for arg in then(a)]


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
    return out + architecture(ex) + moe_args(ex) + PRECISION[ex.plan.precision]


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

