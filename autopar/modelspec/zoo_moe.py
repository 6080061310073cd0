"""Mixture-of-experts blocks of zoo entries and HF configs (Mixtral, Qwen-MoE, DeepSeek-style): the zoo's
block formulas with the MLP replaced by a router, ``experts`` routed SwiGLU experts of width ``moe_ffn``
(``top_k`` per token, dropless) and optional shared experts of total width ``shared_ffn``.

Entry fields (zoo.yaml, or read from a HF config by ``hf.py``):

* ``experts``, ``top_k``: routed experts per MoE block and experts per token;
* ``moe_ffn``: one routed expert's width (default ``ffn``); ``shared_ffn``: width of the shared
  expert(s) every token runs (0: none), ``shared_gate``: a sigmoid gate (h -> 1) scales it (Qwen-MoE);
* ``moe_every`` (HF ``decoder_sparse_step``), ``dense_first`` (DeepSeek's ``first_k_dense_replace``),
  ``dense_layers`` (Qwen's ``mlp_only_layers``): which blocks are MoE; the others are dense blocks of
  width ``ffn``;
* ``head_dim``: attention head width when it is not hidden / heads (Qwen3-MoE).

Counting (the zoo's conventions; per sample of s tokens): the router is an h x E matmul (2*s*h*E FLOPs)
whose fp32 logits are saved (s*E*4 bytes); each token runs ``top_k`` experts, 2*3*h*moe_ffn FLOPs each;
the dispatched tokens (top_k*s*h) and each expert's SwiGLU interior (4 tensors of width moe_ffn, as the
dense block) are saved. Parameters count every expert (total), FLOPs the active ones. Op-level
checkpointing is not modelled for MoE blocks (refused for them).
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.modelspec.spec import LayerSpec, MoESpec
from autopar.modelspec.zoo_attention import attention
from cost_models.gemm_shapes import Gemm

ROUTER_LOGIT_BYTES = 4  # HF routers compute softmax over fp32 logits
SWIGLU_MATRICES = 3
SWIGLU_SAVED = 4  # gate and up outputs, SiLU output, down-projection input (zoo.MLP_SAVED["swiglu"])
_INT_KEYS = ("experts", "top_k", "moe_ffn", "shared_ffn", "moe_every", "dense_first")


def normalize_moe(entry: dict) -> None:
    """Check and fill the MoE fields of a zoo-style entry in place (nothing to do for a dense entry)."""
    if not entry.get("experts"):
        return
    entry.setdefault("moe_ffn", entry["ffn"])
    for key, default in (("top_k", 1), ("shared_ffn", 0), ("moe_every", 1), ("dense_first", 0)):
        entry.setdefault(key, default)
    entry.setdefault("shared_gate", False)
    entry.setdefault("dense_layers", [])
    for key in _INT_KEYS:
        v = entry[key]
        low = 0 if key in ("shared_ffn", "dense_first") else 1
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise AutoparError(f"model.{key}", f"must be an integer >= {low}, got {v!r}",
                               "fix the MoE shape (zoo.yaml entry or config.json)")
    if entry["top_k"] > entry["experts"]:
        raise AutoparError("model.top_k", f"{entry['top_k']} experts per token exceed the {entry['experts']} experts",
                           "give num_experts_per_tok <= the expert count")
    if entry["mlp"] != "swiglu":
        raise AutoparError("model.mlp", f"MoE experts are modelled as SwiGLU MLPs, the entry says {entry['mlp']!r}",
                           "use mlp: swiglu for an MoE entry")


def is_moe_layer(e: dict, i: int) -> bool:
    """Whether block ``i`` of entry ``e`` is an MoE block."""
    return (bool(e.get("experts")) and i >= e["dense_first"] and (i + 1) % e["moe_every"] == 0
            and i not in e["dense_layers"])


def moe_block(x, i: int) -> LayerSpec:
    """LayerSpec of MoE block ``i`` (``x``: the zoo's per-sample shape, ``zoo._Shape``)."""
    e, s, h, a, d, m = x.e, x.s, x.h, x.a, x.d, x.m
    at = attention(x)  # GQA, or DeepSeek's latent attention (zoo_attention)
    qw, kvw = x.qw, x.hkv  # query / attention-output width, K and V width (zoo._Shape: head_dim where stated)
    E, k, fe, fs = e["experts"], e["top_k"], e["moe_ffn"], e["shared_ffn"]
    col_bias = (qw + 2 * kvw) if e["bias"] or e["attn_bias"] or e["qkv_bias"] else 0
    row_bias = h if e["bias"] or e["attn_bias"] else 0
    router = h * E
    experts = E * SWIGLU_MATRICES * h * fe
    shared = SWIGLU_MATRICES * h * fs + (h if fs and e["shared_gate"] else 0)
    norms = e["block_norms"] * x.norm + (2 * x.hd if e["qk_norm"] else 0)  # Qwen3: per-head RMSNorm of Q and K
    attn_core = at.core_flops
    expert_flops = 2.0 * s * k * SWIGLU_MATRICES * h * fe
    flops = 2.0 * s * (at.matmul_params + router + shared) + attn_core + expert_flops
    expert_act = k * s * h * d + SWIGLU_SAVED * k * s * fe * d
    # the QKV input (h), queries, keys, values (at.saved_tp less the attention output)
    act_tp = s * d * (h + at.saved_tp - at.out_width) + expert_act + SWIGLU_SAVED * s * fs * d \
        + s * E * ROUTER_LOGIT_BYTES
    if e["flash"]:
        act_attn = a * s * 4
    else:
        act_attn = a * s * s * (d + (d + m if m else 0))
    divisors = tuple(v for v in (a, x.kv, fe, fs) if v)
    moe = MoESpec(num_experts=E, top_k=k, expert_params=experts, expert_flops=expert_flops,
                  dispatch_bytes=float(k * s * h * d), expert_act_bytes=float(expert_act))
    return LayerSpec(
        f"layers.{i}", "block",
        params=at.tp_params + at.rep_params + col_bias + row_bias + router + experts + shared + norms,
        tp_params=at.tp_params + col_bias + experts + shared, flops=flops, attn_core_flops=attn_core,
        act_tp_bytes=act_tp, act_seq_bytes=s * h * (4 * d + 2 * m) + x.extra_norms_saved + s * d * at.latent_saved,
        act_attn_bytes=act_attn, boundary_bytes=s * h * d, tp_divisors=divisors, tp_comm_bytes=2 * s * h * d,
        tp_collectives=2, tp_plan=f"{e['tp_family']}.block", moe=moe, gemms=_dense_gemms(at, h, fs), gemm_rows=s)


def _dense_gemms(at, h: int, fs: int) -> tuple[Gemm, ...]:
    """The MoE block's matmuls every token runs (attention, shared experts), in execution order; the routed
    experts' matmuls, of data-dependent rows, are not listed (their FLOPs run at the large-GEMM efficiency)."""
    shared = [Gemm(h, fs), Gemm(h, fs), Gemm(fs, h, row=True)] if fs else []
    return (*at.gemms, *shared)
