"""The attention of a zoo block: grouped-query attention (Llama, Qwen, Gemma, GPT: ``gqa``) or DeepSeek's
multi-head latent attention (``mla``), as the numbers the dense and MoE block formulas need.

Multi-head latent attention (DeepSeek-V2 / V3, entry fields ``kv_lora``, ``q_lora`` (0: none),
``qk_nope``, ``qk_rope``, ``v_head``; HF ``DeepseekV3Attention``): the hidden state is projected down to a
query latent (``q_a_proj``, then ``q_a_layernorm``) and a key-value latent plus one shared rotary key
(``kv_a_proj_with_mqa``, then ``kv_a_layernorm``), and up to the heads (``q_b_proj``, ``kv_b_proj``); every head
attends over ``qk_nope + qk_rope`` wide queries and keys and ``v_head`` wide values. Tensor parallelism splits
the up-projections and the output projection by heads (Megatron-Core's MLA); the down-projections and their
norms stay whole on every TP rank (counted in parameters and FLOPs, their FLOPs as if split too: 8% of
DeepSeek-V3's attention parameters) and their latents are saved outside the TP region.
"""

from __future__ import annotations

from typing import NamedTuple

from autopar.errors import AutoparError
from cost_models.gemm_shapes import Gemm

MLA_FIELDS = ("kv_lora", "q_lora", "qk_nope", "qk_rope", "v_head")


class Attention(NamedTuple):
    """One block's attention, per token (widths) or per sample (``core_flops``)."""

    tp_params: int  # projections split by heads under TP
    rep_params: int  # parameters whole on every TP rank (MLA's down-projections and their norms)
    matmul_params: int  # parameters of every projection (their FLOPs: 2 per parameter and token)
    gemms: tuple[Gemm, ...]  # the head-split projections before the core, then the output projection
    core_flops: float  # QK^T and AV over the full s x s, per sample
    saved_tp: int  # widths saved for backward in the TP region: queries, keys, values, attention output
    out_width: int  # the attention output (the output projection's input)
    kv_width: int  # keys and values per token (what a context-parallel all-gather moves)
    latent_saved: int  # widths saved outside the TP region (MLA's latents and their normalised copies)


def gqa(h: int, heads: int, q: int, kv: int, fused: bool, flash: bool, s: int) -> Attention:
    """Queries ``q`` wide (heads x head_dim), keys and values ``kv`` wide each; eager attention repeats K and V
    to every head before its matmuls, so they are saved ``q`` wide."""
    w = h * (q + 2 * kv) + q * h
    projections = (Gemm(h, q + 2 * kv),) if fused else (Gemm(h, q), Gemm(h, kv), Gemm(h, kv))
    kv_saved = kv if flash else q
    return Attention(tp_params=w, rep_params=0, matmul_params=w, gemms=(*projections, Gemm(q, h, row=True)),
                     core_flops=4.0 * s * s * q, saved_tp=2 * q + 2 * kv_saved, out_width=q, kv_width=2 * kv,
                     latent_saved=0)


def mla(h: int, heads: int, e: dict, s: int) -> Attention:
    """DeepSeek's multi-head latent attention (module docstring)."""
    qk, v, ql, kl, rope = e["qk_nope"] + e["qk_rope"], e["v_head"], e["q_lora"], e["kv_lora"], e["qk_rope"]
    q_up = ql * heads * qk if ql else h * heads * qk  # q_b_proj, or q_proj without a query latent
    q_down = h * ql
    kv_down, kv_up = h * (kl + rope), kl * heads * (e["qk_nope"] + v)
    out = heads * v * h
    norms = (ql if ql else 0) + kl  # q_a_layernorm, kv_a_layernorm
    q_gemm = Gemm(ql, heads * qk) if ql else Gemm(h, heads * qk)
    return Attention(tp_params=q_up + kv_up + out, rep_params=q_down + kv_down + norms,
                     matmul_params=q_up + kv_up + out + q_down + kv_down,
                     gemms=(q_gemm, Gemm(kl, heads * (e["qk_nope"] + v)), Gemm(heads * v, h, row=True)),
                     core_flops=2.0 * s * s * heads * (qk + v), saved_tp=heads * (2 * qk + 2 * v),
                     out_width=heads * v, kv_width=heads * (qk + v), latent_saved=2 * ql + 2 * kl + rope)


def attention(x) -> Attention:
    """The attention of a block of ``x`` (``zoo._Shape``): MLA where the entry has a ``kv_lora``, else GQA."""
    e = x.e
    if e.get("kv_lora"):
        return mla(x.h, x.a, e, x.s)
    return gqa(x.h, x.a, x.qw, x.hkv, e["fused_qkv"], e["flash"], x.s)


def normalize_mla(entry: dict) -> None:
    """Check the latent-attention fields of a zoo-style entry in place (nothing to do without ``kv_lora``)."""
    if not entry.get("kv_lora"):
        return
    entry["q_lora"] = entry.get("q_lora") or 0  # DeepSeek-V2-Lite: q_lora_rank null, a plain q_proj
    for key in MLA_FIELDS:
        v = entry.get(key)
        low = 0 if key == "q_lora" else 1
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise AutoparError(f"model.{key}", f"latent attention needs an integer >= {low}, got {v!r}",
                               "give kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
