"""The model zoo: real model shapes (zoo.yaml) turned into ModelSpecs by analytic formulas.

Units are ``embed``, ``layers.0`` .. ``layers.{L-1}`` and ``head``, all per sample (one sequence of
``seq_len`` tokens) at TP degree 1, in the training dtype (``dtype_bytes``).

Conventions (stated once, used by every formula below):

* FLOPs: a multiply-add is 2 FLOPs; only matmuls count (2*m*n*k), as FlopCounterMode does. Causal
  attention is counted as full s x s (QK^T and AV: 4*s^2*h per layer forward), as Megatron-LM
  (Narayanan et al. 2104.04473) and PaLM appendix B (12*L*H*Q*T per token for training) do; Kaplan
  et al. count half. Embedding lookups are free; the LM head is 2*s*h*V.
* Saved activations follow Korthikanti et al. 2205.05198 (per layer, fp16, no TP:
  s*h*(34 + 5*a*s/h) bytes) and split into what sequence parallelism shards (``act_seq``: norm inputs
  and outputs, hidden dropout masks), what TP shards (``act_tp``: Q, K, V, attention output, MLP
  interior) and the attention core (``act_attn``: softmax output, its dropout mask and output).
  Adjustments: SwiGLU saves gate and up outputs, the SiLU output and the down-projection input
  (4 tensors of width ffn instead of GeLU's 2); GQA saves K and V at kv_heads width under flash
  attention (eager attention expands them to all heads first); flash attention saves no s^2 tensor,
  only fp32 softmax statistics (a*s*4 bytes); dropout masks are 1 byte per element (the fused CUDA
  kernel's bool mask); norm statistics (a few bytes per token) and RoPE (cos/sin are shared
  buffers) are left out; index tensors (int64 token / position / type ids) are counted.
* The loss sits on the head unit: its logits are kept in fp32 for the cross entropy (s*V*4 bytes,
  vocab-parallel under TP). The head's ``boundary_bytes`` is its input (s*h*dtype): its output goes
  to the loss on the same stage, and that input is what full checkpointing keeps. ``loss_bytes``
  states those logits (the loss's backward holds several copies: cost_models/memory_terms.py).
* Tied embeddings: the shared matrix is counted once, in ``embed`` (its ``shared_params``); the head's
  params then hold only its own tensors and its ``tied_params`` the matrix it uses, whose copy the cost
  model charges where the runtime keeps one (``CostParams.tied_copy_one_stage``, cost_models/ties.py).
* Op-level selective checkpointing (ckpt ``op``, torchtitan's policy; ``op_policy.py``): a block's
  matmuls run Q, K, V (one fused QKV with ``fused_qkv``: GPT-2, GPT-NeoX), the attention output, then
  the MLP's up (SwiGLU: gate, up) and down projections, as torchtitan's Llama and autopar's models
  order them; the 1st, 3rd, ... outputs are kept, the others recomputed. With flash attention the
  SDPA output (s*h*dtype) and its fp32 statistics are kept; eager attention (bmm, softmax) is recomputed.
* TP (Megatron layout): a block all-reduces s*h*dtype twice per forward (after attention and after
  the MLP); the vocab-parallel embedding once (its output); the vocab-parallel LM head once (its
  input's gradient in backward). Column-parallel weights and biases are sharded; norms and
  row-parallel biases are replicated.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from autopar.errors import AutoparError
from autopar.modelspec.op_policy import Matmul, OpSaved, op_saved
from autopar.modelspec.spec import STATS_BYTES, LayerSpec, ModelSpec
from autopar.modelspec.zoo_attention import Attention, attention, normalize_mla
from autopar.modelspec.zoo_moe import is_moe_layer, moe_block, normalize_moe
from cost_models.gemm_shapes import Gemm

ZOO_FILE = Path(__file__).with_name("zoo.yaml")
INDEX_BYTES = 8  # int64 token / position / type ids saved by embedding lookups
NORM_PARAMS = {"layer": 2, "rms": 1}  # parameters per hidden unit of a norm
MLP_MATRICES = {"gelu": 2, "swiglu": 3}
MLP_SAVED = {"gelu": 2, "swiglu": 4}  # ffn-wide tensors an eager MLP keeps for backward
EMBED_KIND = {"decoder": "tokens", "encoder": "tokens", "vit": "patches"}
HEAD_KIND = {"decoder": "lm", "encoder": "mlm", "vit": "cls"}
CHOICES = {"arch": tuple(EMBED_KIND), "norm": tuple(NORM_PARAMS), "mlp": tuple(MLP_MATRICES),
           "pos": ("learned", "rope", "none")}
REQUIRED = ("layers", "hidden", "heads", "ffn")
# The planner's partition tables are (layers + 2)^2 per stage kind: past this a search cannot finish.
MAX_LAYERS = 4096


@cache
def _zoo() -> dict:
    with open(ZOO_FILE) as f:
        return yaml.safe_load(f)


def zoo_names() -> list[str]:
    """Names of the built-in models, in zoo.yaml order (families grouped)."""
    return list(_zoo()["models"])


def unknown_model(name: str) -> AutoparError:
    """The error for a model spec that is neither a zoo name, a config file nor ``pkg.module:factory``."""
    close = difflib.get_close_matches(name, zoo_names(), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return AutoparError("model", f"unknown model {name!r}",
                        f"{hint}run `autopar list models` for zoo names, or give a HF config.json path "
                        "or pkg.module:factory")


def zoo_entry(name: str) -> dict:
    """The zoo entry ``name`` with its family defaults filled in (a fresh copy; ``name`` included)."""
    models = _zoo()["models"]
    if name not in models:
        raise unknown_model(name)
    entry = dict(copy.deepcopy(_zoo()["families"][models[name]["family"]]))
    entry.update(copy.deepcopy(models[name]))
    entry["name"] = name
    return normalize_entry(entry)


def normalize_entry(entry: dict) -> dict:
    """Fill derived defaults and check a zoo-style entry (also used for HF configs); returns it."""
    for key in REQUIRED:
        if not isinstance(entry.get(key), int) or entry[key] <= 0:
            raise AutoparError(f"model.{key}", f"must be a positive integer, got {entry.get(key)!r}",
                               "fix the model's shape (zoo.yaml entry or config.json)")
    for key, allowed in CHOICES.items():
        if entry.get(key) not in allowed:
            raise AutoparError(f"model.{key}", f"unknown value {entry.get(key)!r}", f"use one of {', '.join(allowed)}")
    entry.setdefault("kv_heads", entry["heads"])
    entry.setdefault("pad_vocab_to", 1)
    entry.setdefault("dtype_bytes", 2)
    for key, default in (("tied", False), ("bias", False), ("attn_bias", False), ("mlp_bias", False),
                         ("qkv_bias", False), ("qk_norm", False), ("dropout", False), ("flash", True),
                         ("type_vocab", 0), ("embed_norm", False), ("tp_family", "gpt"), ("fused_qkv", False),
                         ("block_norms", 2)):
        entry.setdefault(key, default)
    h, a, kv = entry["hidden"], entry["heads"], entry["kv_heads"]
    head_dim = entry.get("head_dim")
    if head_dim is not None and (not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0):
        raise AutoparError("model.head_dim", f"must be a positive integer, got {head_dim!r}",
                           "give the width of one attention head, or leave it out (hidden / heads)")
    if h % a and not head_dim:
        raise AutoparError("model.heads", f"{a} heads do not divide hidden size {h}", "use a head count dividing hidden")
    if kv <= 0 or a % kv:
        raise AutoparError("model.kv_heads", f"{kv} KV heads do not divide {a} heads", "use a divisor of heads")
    if entry["arch"] == "vit":
        for key in ("image", "patch", "channels", "classes"):
            if not isinstance(entry.get(key), int) or entry[key] <= 0:
                raise AutoparError(f"model.{key}", f"ViT needs a positive integer, got {entry.get(key)!r}",
                                   "give image, patch, channels and classes")
        entry.setdefault("seq_len", (entry["image"] // entry["patch"]) ** 2 + 1)
    elif not isinstance(entry.get("vocab"), int) or entry["vocab"] <= 0:
        raise AutoparError("model.vocab", f"must be a positive integer, got {entry.get('vocab')!r}",
                           "give the tokenizer's vocabulary size")
    entry.setdefault("seq_len", entry.get("max_pos", 2048))
    normalize_moe(entry)
    normalize_mla(entry)
    if entry["pos"] == "learned":
        entry.setdefault("max_pos", entry["seq_len"])
    return entry


@dataclass(frozen=True)
class _Shape:
    """The numbers the formulas use, per sample at sequence length s."""

    s: int  # tokens per sample
    h: int
    a: int
    kv: int  # KV heads
    f: int  # ffn width
    V: int  # padded vocab
    d: int  # dtype bytes
    m: int  # dropout-mask bytes per element (0 without dropout)
    e: dict

    @property
    def hd(self) -> int:
        """Width of one attention head: the config's ``head_dim`` where it states one (Qwen3), else h / heads."""
        return self.e.get("head_dim") or self.h // self.a

    @property
    def qw(self) -> int:
        """Width of the queries and of the attention output: heads x head width (h unless ``head_dim`` says)."""
        return self.a * self.hd

    @property
    def hkv(self) -> int:
        return self.kv * self.hd

    @property
    def norm(self) -> int:
        return NORM_PARAMS[self.e["norm"]] * self.h

    @property
    def extra_norms_saved(self) -> int:
        """Bytes per sample the norms beyond a block's two keep for backward (their inputs): Gemma 2 / 3
        normalise each sublayer's output too (``block_norms`` 4)."""
        return (self.e["block_norms"] - 2) * self.s * self.h * self.d

    @property
    def tied(self) -> int:
        """Parameters the LM head shares with the token embedding: the V x h matrix when tied, else 0."""
        return self.V * self.h if self.e["tied"] else 0


def _embed_tokens(x: _Shape) -> LayerSpec:
    e, s, h, d = x.e, x.s, x.h, x.d
    learned = e["pos"] == "learned"
    params = x.V * h + (e["max_pos"] * h if learned else 0) + e["type_vocab"] * h
    params += x.norm if e["embed_norm"] else 0
    ids = 1 + learned + (e["type_vocab"] > 0)
    act_seq = s * INDEX_BYTES * ids + s * h * x.m + (s * h * d if e["embed_norm"] else 0)
    return LayerSpec("embed", "embedding", params=params, tp_params=x.V * h, act_seq_bytes=act_seq,
                     boundary_bytes=s * h * d, tp_divisors=(x.V,), tp_comm_bytes=s * h * d,
                     tp_collectives=1, tp_plan=f"{e['tp_family']}.embed", shared_params=x.tied)


def _embed_patches(x: _Shape) -> LayerSpec:
    e, s, h, d = x.e, x.s, x.h, x.d
    patch_in = e["channels"] * e["patch"] ** 2
    positions = (e["image"] // e["patch"]) ** 2 + 1
    params = patch_in * h + h + h + positions * h  # conv weight + bias, CLS token, position table
    return LayerSpec("embed", "embedding", params=params, flops=2.0 * (s - 1) * patch_in * h,
                     act_seq_bytes=(s - 1) * patch_in * d, boundary_bytes=s * h * d)


def _block_gemms(x: _Shape, at: Attention) -> tuple[Gemm, ...]:
    """A block's matmuls in execution order, each ``[s, k] @ [k, n]``; ``row``: row-parallel under TP."""
    h, f = x.h, x.f
    mlp_in = [Gemm(h, f)] * (MLP_MATRICES[x.e["mlp"]] - 1)
    return (*at.gemms, *mlp_in, Gemm(f, h, row=True))


def _block_op(x: _Shape, at: Attention) -> OpSaved:
    """What ckpt ``op`` keeps of a block and recomputes (module docstring; ``op_policy``)."""
    s, h, d = x.s, x.h, x.d
    matmuls = [Matmul(s * g.n * d, 2.0 * s * g.k * g.n, g.row) for g in _block_gemms(x, at)]
    flash = x.e["flash"]
    sdpa = s * at.out_width * d + x.a * s * STATS_BYTES if flash else 0.0
    return op_saved(s * h * d, matmuls, sdpa, 0.0 if flash else at.core_flops)


def _block(x: _Shape, i: int) -> LayerSpec:
    e, s, h, a, f, d, m, q = x.e, x.s, x.h, x.a, x.f, x.d, x.m, x.qw
    at = attention(x)  # GQA, or DeepSeek's latent attention (zoo_attention)
    n_mlp = MLP_MATRICES[e["mlp"]]
    w_mlp = n_mlp * h * f
    attn_bias, mlp_bias = e["bias"] or e["attn_bias"], e["bias"] or e["mlp_bias"]  # Llama: either, or both
    col_bias = ((q + 2 * x.hkv) if attn_bias or e["qkv_bias"] else 0) + ((n_mlp - 1) * f if mlp_bias else 0)
    row_bias = (h if attn_bias else 0) + (h if mlp_bias else 0)  # out / down-projection biases: replicated
    qk_norm = 2 * x.hd if e["qk_norm"] else 0  # Qwen3: RMSNorm of each query and key head (one weight per width)
    attn_core = at.core_flops  # QK^T and AV, full s x s (see module docstring)
    act_tp = s * d * at.saved_tp + MLP_SAVED[e["mlp"]] * s * f * d
    if e["flash"]:
        act_attn = a * s * STATS_BYTES
    else:  # softmax output; with dropout also its mask and output (Korthikanti's 5*a*s^2 in fp16)
        act_attn = a * s * s * (d + (d + m if m else 0))
    out = at.out_width
    return LayerSpec(
        f"layers.{i}", "block",
        params=at.tp_params + at.rep_params + w_mlp + col_bias + row_bias + e["block_norms"] * x.norm + qk_norm,
        tp_params=at.tp_params + w_mlp + col_bias, flops=2.0 * s * (at.matmul_params + w_mlp) + attn_core,
        attn_core_flops=attn_core, act_tp_bytes=act_tp,
        act_seq_bytes=s * h * (4 * d + 2 * m) + x.extra_norms_saved + s * d * at.latent_saved,
        act_attn_bytes=act_attn, boundary_bytes=s * h * d,
        tp_divisors=(a, f) if e["tp_family"] == "gpt" else (a, x.kv, f), tp_comm_bytes=2 * s * h * d, tp_collectives=2,
        tp_plan=f"{e['tp_family']}.block", op=_block_op(x, at), kv_bytes=float(s * at.kv_width * d),
        gemms=_block_gemms(x, at), gemm_rows=s,
        # linear inputs (LayerSpec.cast_input_delta): the two norm outputs (QKV's, the MLP's), the down-projection's
        # input, and the out-projection's, which flash attention keeps as its own output (eager attention does not)
        lin_in_seq_bytes=2.0 * s * h * d, lin_in_tp_bytes=s * f * d + (0.0 if e["flash"] else s * out * d),
        lin_in_shared_bytes=s * out * d if e["flash"] else 0.0)


def _head_lm(x: _Shape) -> LayerSpec:
    s, h, d, V = x.s, x.h, x.d, x.V
    own = 0 if x.e["tied"] else V * h
    return LayerSpec("head", "head", params=x.norm + own, tp_params=own, tied_params=x.tied, flops=2.0 * s * h * V,
                     act_tp_bytes=s * V * STATS_BYTES, act_seq_bytes=2 * s * h * d, boundary_bytes=s * h * d,
                     tp_divisors=(V,), tp_comm_bytes=s * h * d, tp_collectives=1,
                     tp_plan=f"{x.e['tp_family']}.head", loss_bytes=s * V * STATS_BYTES,
                     gemms=(Gemm(h, V),), gemm_rows=s)


def _head_mlm(x: _Shape) -> LayerSpec:
    """BERT masked-LM head: dense + GeLU + LayerNorm, then the (tied) decoder with its own bias."""
    s, h, d, V = x.s, x.h, x.d, x.V
    own = V + (0 if x.e["tied"] else V * h)
    return LayerSpec("head", "head", params=h * h + h + x.norm + own, tp_params=own, tied_params=x.tied,
                     flops=2.0 * s * h * (h + V), act_tp_bytes=s * V * STATS_BYTES, act_seq_bytes=4 * s * h * d,
                     boundary_bytes=s * h * d, tp_divisors=(V,), tp_comm_bytes=s * h * d, tp_collectives=1,
                     tp_plan=f"{x.e['tp_family']}.head", loss_bytes=s * V * STATS_BYTES)


def _head_cls(x: _Shape) -> LayerSpec:
    """ViT: final norm over all tokens, linear classifier on the CLS token."""
    s, h, d, c = x.s, x.h, x.d, x.e["classes"]
    return LayerSpec("head", "head", params=x.norm + h * c + c, flops=2.0 * h * c,
                     act_seq_bytes=s * h * d + h * d + c * STATS_BYTES, boundary_bytes=s * h * d)


EMBED_UNITS = {"tokens": _embed_tokens, "patches": _embed_patches}
HEAD_UNITS = {"lm": _head_lm, "mlm": _head_mlm, "cls": _head_cls}


def spec_from_entry(entry: dict, seq_len: int | None = None, dtype_bytes: int | None = None,
                    source: str | None = None) -> ModelSpec:
    """ModelSpec of a normalized zoo-style entry at ``seq_len`` (default: the entry's) in ``dtype_bytes``."""
    e = entry
    s = e["seq_len"] if seq_len is None else seq_len
    if not isinstance(s, int) or s <= 0:
        raise AutoparError("seq_len", f"must be a positive integer, got {s!r}", "pass --seq-len N with N >= 1")
    if e["pos"] == "learned" and e["arch"] != "vit" and s > e["max_pos"]:
        raise AutoparError("seq_len", f"{e['name']} has learned positions up to {e['max_pos']}, asked {s}",
                           f"use --seq-len {e['max_pos']} or less")
    if e["arch"] == "vit" and s < 2:
        raise AutoparError("seq_len", f"a ViT needs at least the CLS token and one patch, got {s}",
                           "use --seq-len >= 2 (patches + 1)")
    if e["layers"] > MAX_LAYERS:
        raise AutoparError("layers", f"too large: {e['layers']} transformer layers (at most {MAX_LAYERS})",
                           "check the model's layer count (num_hidden_layers / n_layer)")
    d = e["dtype_bytes"] if dtype_bytes is None else dtype_bytes
    if d not in (1, 2, 4, 8):
        raise AutoparError("dtype_bytes", f"must be 1, 2, 4 or 8, got {d!r}", "use 2 for bf16/fp16 training")
    pad = e["pad_vocab_to"]
    vocab = -(-e["vocab"] // pad) * pad
    x = _Shape(s=s, h=e["hidden"], a=e["heads"], kv=e["kv_heads"], f=e["ffn"], V=vocab, d=d,
               m=1 if e["dropout"] else 0, e=e)
    layers = [EMBED_UNITS[EMBED_KIND[e["arch"]]](x)]
    layers += [moe_block(x, i) if is_moe_layer(e, i) else _block(x, i) for i in range(e["layers"])]
    layers.append(HEAD_UNITS[HEAD_KIND[e["arch"]]](x))
    meta = {k: e[k] for k in ("arch", "norm", "mlp", "pos", "bias", "dropout", "flash", "fused_qkv") if k in e}
    meta.update({k: e[k] for k in ("experts", "top_k", "moe_ffn", "shared_ffn") if e.get(k)})
    # what a tool's model arguments need beyond the shape (autopar/export/megatron.py architecture)
    meta.update({k: e[k] for k in ("attn_bias", "mlp_bias", "qkv_bias", "qk_norm", "block_norms", "head_dim",
                                   "rope_theta", "rope_scaling", "kv_lora", "q_lora", "qk_nope", "qk_rope", "v_head")
                 if e.get(k)})
    meta.update(tied_embeddings=bool(e["tied"]) and e["arch"] != "vit", family=e.get("family", ""),
                vocab_unpadded=e["vocab"])
    return ModelSpec(name=e["name"], seq_len=s, layers=layers, hidden=x.h, vocab=vocab, num_heads=x.a,
                     num_kv_heads=x.kv, ffn=x.f, dtype_bytes=d, source=source or e["name"], meta=meta)


def from_zoo(name: str, seq_len: int | None = None, dtype_bytes: int | None = None) -> ModelSpec:
    """ModelSpec of zoo model ``name`` (see :func:`zoo_names`) at ``seq_len`` tokens per sample."""
    return spec_from_entry(zoo_entry(name), seq_len=seq_len, dtype_bytes=dtype_bytes)
