"""The memory-bound traffic of eager Llama blocks, counted from the ops they dispatch, as ``act_traffic``.

``CostParams.act_traffic`` (3 by default) is the traffic of fused kernels per byte of activations a layer saves.
Eager PyTorch runs one kernel per operator: torchtitan's RMSNorm upcasts to fp32 and makes six passes, its
rotary embedding three more over q and k, SwiGLU two over the FFN width, and autograd's backward as many again.
``autopar.profile.eager_traffic.count_traffic`` counts what those kernels move in one forward and backward of a
block on the meta device (nothing is computed; matmuls and attention are priced by FLOPs and not counted), and
the ratio to the block's saved activations (``LayerSpec.saved_bytes``, what the cost model multiplies) is the
``act_traffic`` that prices the eager block. Nothing is fitted to a measured time. The table also gives the
kernels a block launches (aten ops other than views and allocations; the attention stand-in's none), forward and
backward: what a per-layer-call launch cost (``CostParams.layer_overhead_s``) multiplies.

Blocks counted:

* torchtitan's Llama ``TransformerBlock`` at 9dec370 (the commit of its 2024-12 H100 benchmark, whose eager /
  torch.compile pairs are in ``benchmarks/data/torchtitan_h100_llama3_202412.yaml``): the code below is
  transcribed from ``torchtitan/models/llama/model.py`` and ``torchtitan/models/norms.py`` (``norm_type =
  "rmsnorm"`` in ``train_configs/llama3_*.toml``), with F.scaled_dot_product_attention replaced by the fused
  attention stand-in (a flash kernel's shapes, nothing counted).
* transformers' own ``LlamaDecoderLayer`` (the installed version), with the same stand-in registered as its
  attention function: the module autopar's runtime trains.

    python benchmarks/eager_traffic.py    # prints the table, writes results/eager_traffic.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from autopar.profile.eager_traffic import count_traffic, fused_attention

HERE = Path(__file__).resolve().parent
DTYPE = torch.bfloat16
# (name, dim, heads, kv heads, FFN hidden, seq_len, blocks): the shapes of the measured files that run eager.
# Llama 3.1: torchtitan/models/llama/__init__.py at 9dec370, seq 8192 (train_configs); Llama 2 as fms-fsdp builds
# it (get_model_config at 5e522b4, seq 4096; benchmarks/data/fms_fsdp_*.yaml).
SHAPES = (("llama3-8b", 4096, 32, 8, 14336, 8192, ("torchtitan", "transformers")),
          ("llama3-70b", 8192, 64, 8, 28672, 8192, ("torchtitan", "transformers")),
          ("llama2-7b", 4096, 32, 32, 11008, 4096, ("fms", "transformers")),
          ("llama2-13b", 5120, 40, 40, 13824, 4096, ("fms",)),
          ("llama2-34b", 8192, 64, 8, 22016, 4096, ("fms",)),
          ("llama2-70b", 8192, 64, 8, 28672, 4096, ("fms",)))


# ---- torchtitan 9dec370, transcribed (comments and docstrings dropped) ----
class RMSNorm(nn.Module):  # torchtitan/models/norms.py
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis[0:xq_.shape[1]].view(1, xq_.shape[1], 1, xq_.shape[-1])  # reshape_for_broadcast
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x, n_rep: int):
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, n_kv_heads * n_rep,
                                                                                       head_dim)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.n_rep = n_heads // n_kv_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x, freqs_cis):
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        keys = repeat_kv(xk, self.n_rep)
        values = repeat_kv(xv, self.n_rep)
        xq, xk, xv = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        output = fused_attention(xq, xk, xv, is_causal=True)  # F.scaled_dot_product_attention in torchtitan
        output = output.transpose(1, 2).contiguous()
        return self.wo(output.view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int):
        super().__init__()
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps=1e-5)
        self.ffn_norm = RMSNorm(dim, eps=1e-5)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))
# ---- end of transcription ----


# ---- foundation-model-stack f29e546d (fms-fsdp's model code), transcribed: fms/modules/layernorm.py,
# positions.py RotaryEmbedding.adjusted_qk, attention.py MultiHeadAttention.forward, feedforward.py
# GatedLinearUnit.forward, models/llama.py LLaMABlock.forward (p_dropout 0, no bias, no cache) ----
class FmsNorm(nn.Module):  # LayerNormParameterized(use_mean=False, use_high_precision_pow=True, scale, no shift)
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        x = xf.type_as(x)
        return self.weight * x


def fms_adjusted_qk(q, k, cached_freqs, position_ids):
    q_ = q.float().view(*q.size()[:-1], -1, 2)  # B L H D/2 2
    k_ = k.float().view(*k.size()[:-1], -1, 2)
    freqs = cached_freqs[position_ids].float()  # 1 L D/2 2 2
    q_out = freqs[:, -q.size(1):, None, :, :, :].mul(q_.unsqueeze(-2)).sum(5).flatten(3).type_as(q)
    k_out = freqs[:, -k.size(1):, None, :, :, :].mul(k_.unsqueeze(-2)).sum(5).flatten(3).type_as(k)
    return q_out.view_as(q), k_out.view_as(k)


class FmsAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.nheads, self.kvheads, self.head = n_heads, n_kv_heads, dim // n_heads
        self.query = nn.Linear(dim, n_heads * self.head, bias=False)
        self.key = nn.Linear(dim, n_kv_heads * self.head, bias=False)
        self.value = nn.Linear(dim, n_kv_heads * self.head, bias=False)
        self.dense = nn.Linear(n_heads * self.head, dim, bias=False)

    def forward(self, x, cached_freqs, position_ids):
        b, s, _ = x.size()
        queries = self.query(x).view(b, s, self.nheads, self.head)
        keys = self.key(x).view(b, s, self.kvheads, self.head)
        values = self.value(x).view(b, s, self.kvheads, self.head)
        queries, keys = fms_adjusted_qk(queries, keys, cached_freqs, position_ids)
        queries, keys, values = queries.transpose(2, 1), keys.transpose(2, 1), values.transpose(2, 1)
        expansion = self.nheads // self.kvheads
        if expansion != 1:
            keys = keys.unsqueeze(2).expand(-1, -1, expansion, -1, -1).flatten(1, 2)
            values = values.unsqueeze(2).expand(-1, -1, expansion, -1, -1).flatten(1, 2)
        attn = fused_attention(queries, keys, values, is_causal=True)  # F.scaled_dot_product_attention in fms
        attn = attn.transpose(2, 1).contiguous().view(b, s, self.nheads * self.head)
        return self.dense(attn)


class FmsGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.wg = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.wg(x)) * self.w1(x))  # activation_fn "swish" = nn.SiLU


class FmsBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int):
        super().__init__()
        self.ln, self.ff_ln = FmsNorm(dim), FmsNorm(dim)
        self.attn = FmsAttention(dim, n_heads, n_kv_heads)
        self.ff_sub_layer = FmsGLU(dim, hidden)

    def forward(self, x, cached_freqs, position_ids):
        x = self.attn(self.ln(x), cached_freqs, position_ids) + x
        return self.ff_sub_layer(self.ff_ln(x)) + x
# ---- end of transcription ----


def _as_row(c) -> dict:
    return {"fwd": c.fwd_bytes, "bwd": c.bwd_bytes, "by_op": dict(c.by_op.most_common()),
            "kernels": (c.fwd_kernels, c.bwd_kernels)}


def torchtitan_block(dim: int, heads: int, kv: int, hidden: int, seq: int) -> dict:
    """Counted bytes of one forward + backward of torchtitan's block, bf16 (FSDP2's param_dtype), one sample."""
    with torch.device("meta"):
        block = TransformerBlock(dim, heads, kv, hidden).to(DTYPE)
        x = torch.empty(1, seq, dim, dtype=DTYPE, requires_grad=True)
        freqs = torch.empty(seq, dim // heads // 2, dtype=torch.complex64)  # precompute_freqs_cis: complex64
    c = count_traffic(lambda: block(x, freqs))
    return _as_row(c)


def fms_block(dim: int, heads: int, kv: int, hidden: int, seq: int) -> dict:
    """The same for fms's LLaMABlock (fms-fsdp: FSDP1 bf16 mixed precision, eager)."""
    with torch.device("meta"):
        block = FmsBlock(dim, heads, kv, hidden).to(DTYPE)
        x = torch.empty(1, seq, dim, dtype=DTYPE, requires_grad=True)
        freqs = torch.empty(seq, dim // heads // 2, 2, 2)  # compute_freqs_cis: fp32 rotation matrices
        pos = torch.arange(seq)[None]
    c = count_traffic(lambda: block(x, freqs, pos))
    return _as_row(c)


def hf_block(dim: int, heads: int, kv: int, hidden: int, seq: int) -> dict:
    """The same for transformers' LlamaDecoderLayer, its attention the fused stand-in (transformers >= 4.48, whose
    AttentionInterface takes a registered attention function; None with an older release)."""
    try:
        from transformers import AttentionInterface, LlamaConfig
    except ImportError:
        return None
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    def attend(module, q, k, v, mask, **kw):  # HF's attention interface: (output [b, s, h, d], weights)
        return fused_attention(q, k, v).transpose(1, 2), None

    AttentionInterface.register("autopar_fused_count", attend)
    cfg = LlamaConfig(hidden_size=dim, num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=hidden,
                      num_hidden_layers=1, max_position_embeddings=seq, attn_implementation="autopar_fused_count")
    with torch.device("meta"):
        layer = LlamaDecoderLayer(cfg, 0).to(DTYPE)
        rope = LlamaRotaryEmbedding(cfg)
        x = torch.empty(1, seq, dim, dtype=DTYPE, requires_grad=True)
        pos = torch.arange(seq)[None]
        cos, sin = rope(x, pos)
    def forward():
        out = layer(x, attention_mask=None, position_embeddings=(cos, sin), position_ids=pos)
        return out[0] if isinstance(out, tuple) else out  # releases before 4.54 return (hidden, ...)

    return _as_row(count_traffic(forward))


def saved_bytes(dim: int, heads: int, kv: int, hidden: int, seq: int) -> float:
    """Activation bytes per sample the cost model says the block saves without checkpointing (tp 1): what
    ``act_traffic`` multiplies."""
    from autopar.modelspec.hf import entry_from_hf_config
    from autopar.modelspec.zoo import spec_from_entry
    cfg = {"model_type": "llama", "hidden_size": dim, "num_attention_heads": heads, "num_key_value_heads": kv,
           "intermediate_size": hidden, "num_hidden_layers": 1, "vocab_size": 32000, "max_position_embeddings": seq}
    spec = spec_from_entry(entry_from_hf_config(cfg, "llama"), seq_len=seq, dtype_bytes=2)
    block = next(layer for layer in spec.layers if layer.kind == "block")
    return float(block.saved_bytes("none", 1, False, 1.0))


BLOCKS = {"torchtitan": ("torchtitan 9dec370", torchtitan_block), "fms": ("fms f29e546d", fms_block),
          "transformers": ("transformers LlamaDecoderLayer", hf_block)}


def rows() -> list[dict]:
    out = []
    for name, dim, heads, kv, hidden, seq, impls in SHAPES:
        saved = saved_bytes(dim, heads, kv, hidden, seq)
        for impl in impls:
            label, fn = BLOCKS[impl]
            c = fn(dim, heads, kv, hidden, seq)
            if c is None:
                print(f"{name}: {label} skipped (this transformers has no AttentionInterface)")
                continue
            out.append({"model": name, "block": label, "seq_len": seq, "fwd_bytes_per_token": c["fwd"] / seq,
                        "bwd_bytes_per_token": c["bwd"] / seq, "saved_bytes_per_token": saved / seq,
                        "act_traffic": (c["fwd"] + c["bwd"]) / saved, "bwd_over_fwd": c["bwd"] / c["fwd"],
                        "kernels_fwd": c["kernels"][0], "kernels_bwd": c["kernels"][1],
                        "top_ops": dict(list(c["by_op"].items())[:8])})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(HERE / "results" / "eager_traffic.json"))
    args = ap.parse_args()
    table = rows()
    print(f"{'model':12s} {'block':32s} {'fwd B/tok':>10s} {'bwd B/tok':>10s} {'saved B/tok':>11s} "
          f"{'act_traffic':>11s} {'bwd/fwd':>7s} {'kernels f/b':>11s}")
    for r in table:
        print(f"{r['model']:12s} {r['block']:32s} {r['fwd_bytes_per_token']:10.0f} {r['bwd_bytes_per_token']:10.0f} "
              f"{r['saved_bytes_per_token']:11.0f} {r['act_traffic']:11.2f} {r['bwd_over_fwd']:7.2f} "
              f"{r['kernels_fwd']:5d}/{r['kernels_bwd']:<5d}")
    Path(args.output).write_text(json.dumps({"what": __doc__.splitlines()[0], "fused_act_traffic": 3.0,
                                             "rows": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
