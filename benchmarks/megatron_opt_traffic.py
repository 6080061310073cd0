"""The memory-bound traffic of Megatron-DeepSpeed's OPT block at fp32, counted from the ops it dispatches, as
``act_traffic``.

Sailor's OPT runs (``benchmarks/data/sailor_gh200_opt350_clariden.yaml``) and per-layer profiles
(``benchmarks/data/layer_profiles/sailor_megatron_deepspeed.yaml``) train Megatron-DeepSpeed's ``OPTModelPipe`` in
fp32. At fp32 Megatron's fused kernels mostly step aside: ``FusedScaleMaskSoftmax`` runs its torch path unless the
scores are half precision (``is_kernel_available``: ``input_in_float16``), so the s x s scores are written by the
``baddbmm``, masked in place and soft-maxed as separate kernels, each over 4-byte elements. The block below is
transcribed at TP 1 from the code those runs used, and ``autopar.profile.eager_traffic.count_traffic`` counts what
its kernels move in one forward and backward on the meta device (matmuls are priced by FLOPs and not counted). The
ratio to the bytes the cost model's block saves (``LayerSpec.saved_bytes``, what ``act_traffic`` multiplies) is the
``act_traffic`` a measured file states for this framework. Nothing is fitted to a measured time.

Transcribed from eth-easl/sailor @ cf2c8e3c, third_party/Megatron-DeepSpeed: ``megatron/model/opt_model.py``
(``OPTParallelAttention.forward``, ``OPTParallelTransformerLayer.forward``: pre-norm; the row-parallel ``dense`` and
``fc2`` and the column-parallel ``fc1`` are built with ``skip_bias_add=True`` and the layer drops the bias they
return, so only ``query_key_value`` adds one; the hidden dropouts are commented out), ``megatron/model/fused_softmax.py``
(``forward_torch_softmax`` with ``scale=None``: no scaling, no cast at fp32), ``megatron/model/utils.py``
(``attention_mask_func``: ``masked_fill_(mask, -10000.0)``), ``megatron/model/__init__.py`` (``MixedFusedLayerNorm``:
one fused kernel, counted here as ``native_layer_norm``).

    python benchmarks/megatron_opt_traffic.py    # prints the table, writes results/megatron_opt_traffic.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from autopar.measured.model import model_from_config
from autopar.modelspec.spec import LayerSpec
from autopar.profile.eager_traffic import count_traffic

HERE = Path(__file__).resolve().parent
DTYPE = torch.float32
# (name, hidden, heads, FFN, seq): Sailor's profile_all.py model_configs, the OPT shapes (FFN 4h, Megatron's default)
SHAPES = (("OPT-350", 1024, 16, 4096, 2048), ("OPT-30", 7168, 56, 28672, 2048))


# ---- Megatron-DeepSpeed (Sailor's fork, cf2c8e3c) OPT layer at TP 1, transcribed ----
class OPTAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.query_key_value = nn.Linear(dim, 3 * dim)  # ColumnParallelLinear: adds its bias
        self.dense = nn.Linear(dim, dim, bias=False)  # RowParallelLinear(skip_bias_add=True): bias dropped

    def forward(self, x, mask):  # x: [s, b, h]
        s, b, _ = x.shape
        mixed = self.query_key_value(x).view(s, b, self.heads, 3 * self.head_dim)
        q, k, v = torch.split(mixed, self.head_dim, dim=-1)  # split_tensor_along_last_dim: views
        q = q.reshape(s, b * self.heads, -1)
        k = k.reshape(s, b * self.heads, -1)
        out = torch.empty(b * self.heads, s, s, dtype=q.dtype, device=q.device)
        scores = torch.baddbmm(out, q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2), beta=0.0, alpha=1.0)
        scores = scores.view(b, self.heads, s, s)
        scores.masked_fill_(mask, -10000.0)  # attention_mask_func
        probs = torch.nn.Softmax(dim=-1)(scores)  # forward_torch_softmax at fp32, scale None
        v = v.reshape(s, b * self.heads, -1)
        ctx = torch.bmm(probs.view(b * self.heads, s, s), v.transpose(0, 1))
        ctx = ctx.view(b, self.heads, s, self.head_dim).permute(2, 0, 1, 3).contiguous().view(s, b, -1)
        return self.dense(ctx)


class OPTLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.self_attn_layer_norm, self.final_layer_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = OPTAttention(dim, heads)
        self.fc1 = nn.Linear(dim, ffn, bias=False)  # skip_bias_add=True, bias dropped by the layer
        self.fc2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, mask):
        h = x + self.attention(self.self_attn_layer_norm(x), mask)
        shape = h.shape
        h = h.reshape(-1, h.size(-1))
        out = self.fc2(F.relu(self.fc1(self.final_layer_norm(h))))
        return (h + out).view(shape)
# ---- end of transcription ----


def counted(dim: int, heads: int, ffn: int, seq: int) -> tuple[int, int, tuple[int, int]]:
    """(forward bytes, backward bytes, (forward kernels, backward kernels)) of one sample through the layer."""
    with torch.device("meta"):
        layer = OPTLayer(dim, heads, ffn).to(DTYPE)
        x = torch.empty(seq, 1, dim, dtype=DTYPE, requires_grad=True)
        mask = torch.empty(1, 1, seq, seq, dtype=torch.bool)
    c = count_traffic(lambda: layer(x, mask))
    return c.fwd_bytes, c.bwd_bytes, (c.fwd_kernels, c.bwd_kernels)


def block_spec(dim: int, heads: int, ffn: int, seq: int, cache: dict | None = None) -> LayerSpec:
    """The cost model's block of this shape: a GPT block (learned positions, LayerNorm, MLP of ``ffn``), fp32
    activations, eager attention. ``cache``: ``model_from_config``'s, for callers building many."""
    cfg = {"model_type": "gpt2", "n_layer": 1, "n_embd": dim, "n_head": heads, "n_inner": ffn, "vocab_size": 50304,
           "n_positions": seq, "tie_word_embeddings": False, "attn_implementation": "eager"}
    model, _ = model_from_config(cfg, seq, "shape", {} if cache is None else cache, dtype_bytes=4)
    return next(layer for layer in model.layers if layer.kind == "block")


def saved_bytes(dim: int, heads: int, ffn: int, seq: int) -> float:
    """Activation bytes per sample the cost model's block of this shape saves at fp32, eager, TP 1."""
    return float(block_spec(dim, heads, ffn, seq).saved_bytes("none", 1, False, 1.0))


def rows() -> list[dict]:
    out = []
    for name, dim, heads, ffn, seq in SHAPES:
        fwd, bwd, kernels = counted(dim, heads, ffn, seq)
        saved = saved_bytes(dim, heads, ffn, seq)
        out.append({"model": name, "fwd_bytes_per_token": fwd / seq, "bwd_bytes_per_token": bwd / seq,
                    "saved_bytes_per_token": saved / seq, "act_traffic": (fwd + bwd) / saved,
                    "kernels_fwd": kernels[0], "kernels_bwd": kernels[1]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(HERE / "results" / "megatron_opt_traffic.json"))
    args = ap.parse_args()
    table = rows()
    print(f"{'model':8s} {'fwd B/tok':>10s} {'bwd B/tok':>10s} {'saved B/tok':>11s} {'act_traffic':>11s} "
          f"{'kernels f/b':>11s}")
    for r in table:
        print(f"{r['model']:8s} {r['fwd_bytes_per_token']:10.0f} {r['bwd_bytes_per_token']:10.0f} "
              f"{r['saved_bytes_per_token']:11.0f} {r['act_traffic']:11.2f} {r['kernels_fwd']:5d}/{r['kernels_bwd']:<5d}")
    Path(args.output).write_text(json.dumps({"what": __doc__.splitlines()[0], "fused_act_traffic": 3.0,
                                             "rows": table}, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
