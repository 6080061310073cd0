"""Hugging Face ``config.json`` -> zoo-style entry -> ModelSpec (the zoo's formulas; no transformers needed).

Supported ``model_type``: llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3_text, gpt2, gpt_neox, bert,
vit, and the mixture-of-experts mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3 (``moe`` below; blocks
from ``zoo_moe``, DeepSeek's latent attention from ``zoo_attention``). Qwen2's Q/K/V biases (``qkv_bias``), the
per-head Q/K norms of Qwen3 and Gemma 3 (``qk_norm``), Gemma 2 / 3's norms of each sublayer's output
(``block_norms``) and a ``head_dim`` that is not hidden / heads are counted; Gemma 2's logit soft-capping and
the sliding windows of Mistral, Qwen2, Phi-3 and Gemma 2 / 3 are not (full attention is counted). The default
sequence length is ``max_position_embeddings`` capped at ``DEFAULT_SEQ_CAP`` (long-context maxima are rarely
the training length; pass ``--seq-len``). The attention implementation comes from ``attn_implementation``
(``ATTN_IMPLEMENTATIONS``): ``eager`` materialises the s x s scores (their memory, and their HBM traffic in the
cost model); absent, flash/SDPA is assumed, as transformers picks SDPA by default.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from autopar.errors import AutoparError
from autopar.modelspec.spec import ModelSpec
from autopar.modelspec.zoo import normalize_entry, spec_from_entry, zoo_names

DEFAULT_SEQ_CAP = 8192
# A model source naming a config of a formula family traced instead (``from_hf_config(trace=True)``, search --trace)
TRACED = "traced:"
SHAPE_FACTS = ("hidden", "vocab", "num_heads", "num_kv_heads", "ffn")  # ModelSpec's, for the CLI and export
# attn_implementation -> whether the kernel keeps the s x s scores out of memory (flash-style).
ATTN_IMPLEMENTATIONS = {"eager": False, "sdpa": True, "flash_attention_2": True, "flash_attention_3": True,
                        "flex_attention": True}
_LLAMA = {
    "shape": {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
              "kv_heads": "num_key_value_heads", "ffn": "intermediate_size", "vocab": "vocab_size",
              "seq_len": "max_position_embeddings", "head_dim": "head_dim"},
    # attention_bias: q, k, v and o projections biased; mlp_bias: gate, up and down (transformers' LlamaConfig)
    "flags": {"tied": ("tie_word_embeddings", False), "attn_bias": ("attention_bias", False),
              "mlp_bias": ("mlp_bias", False), "dropout": ("attention_dropout", 0.0)},
    "fixed": {"arch": "decoder", "norm": "rms", "mlp": "swiglu", "pos": "rope", "tp_family": "llama"},
}
_QWEN_MOE = {"experts": ("num_experts", "num_local_experts"), "top_k": "num_experts_per_tok", "moe_ffn": "moe_intermediate_size",
             "shared_ffn": "shared_expert_intermediate_size", "moe_every": "decoder_sparse_step",
             "dense_layers": "mlp_only_layers"}
# DeepSeek-V2 / V3: routed experts, ``n_shared_experts`` shared ones each moe_intermediate_size wide, the first
# ``first_k_dense_replace`` blocks dense, and multi-head latent attention (zoo_attention.mla)
_DEEPSEEK = {**_LLAMA, "moe": {"experts": "n_routed_experts", "top_k": "num_experts_per_tok",
                               "moe_ffn": "moe_intermediate_size", "moe_every": "moe_layer_freq",
                               "dense_first": "first_k_dense_replace", "kv_lora": "kv_lora_rank",
                               "q_lora": "q_lora_rank", "qk_nope": "qk_nope_head_dim", "qk_rope": "qk_rope_head_dim",
                               "v_head": "v_head_dim"},
             "products": {"shared_ffn": ("n_shared_experts", "moe_intermediate_size")}}
_GEMMA = {**_LLAMA, "flags": {**_LLAMA["flags"], "tied": ("tie_word_embeddings", True)}}
# model_type -> how to read it: "shape" zoo field <- config key; "flags" zoo field <- (config key,
# default), truthy values turn a flag on; "fixed" values every such model has; "moe" zoo MoE field
# (autopar/modelspec/zoo_moe.py) <- config key (or the first present of several spellings).
HF_TYPES = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "mixtral": {**_LLAMA, "moe": {"experts": "num_local_experts", "top_k": "num_experts_per_tok"}},
    "qwen2": {**_LLAMA, "fixed": {**_LLAMA["fixed"], "qkv_bias": True}},  # Qwen2Attention: biased q/k/v_proj
    # Qwen3Attention: unbiased projections, an RMSNorm over each query and key head, heads head_dim wide
    "qwen3": {**_LLAMA, "fixed": {**_LLAMA["fixed"], "qk_norm": True}},
    "qwen2_moe": {**_LLAMA, "fixed": {**_LLAMA["fixed"], "shared_gate": True, "qkv_bias": True}, "moe": _QWEN_MOE},
    "phi3": {**_LLAMA, "fixed": {**_LLAMA["fixed"], "fused_qkv": True}},  # Phi-3: one qkv_proj, one gate_up_proj
    # Gemma: GeGLU (three matrices, as SwiGLU), heads head_dim wide, tied embeddings; Gemma 2 / 3 also normalise
    # each sublayer's output (four norms a block), Gemma 3 each query and key head
    "gemma": _GEMMA,
    "gemma2": {**_GEMMA, "fixed": {**_GEMMA["fixed"], "block_norms": 4}},
    "gemma3_text": {**_GEMMA, "fixed": {**_GEMMA["fixed"], "block_norms": 4, "qk_norm": True}},
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": _DEEPSEEK,
    "qwen3_moe": {**_LLAMA, "fixed": {**_LLAMA["fixed"], "qk_norm": True}, "moe": _QWEN_MOE},
    "gpt2": {
        "shape": {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "ffn": "n_inner",
                  "vocab": "vocab_size", "seq_len": "n_positions", "max_pos": "n_positions"},
        "flags": {"tied": ("tie_word_embeddings", True), "bias": (None, True), "dropout": ("resid_pdrop", 0.1)},
        "fixed": {"arch": "decoder", "norm": "layer", "mlp": "gelu", "pos": "learned", "tp_family": "gpt",
                  "fused_qkv": True},
    },
    "gpt_neox": {
        "shape": {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                  "ffn": "intermediate_size", "vocab": "vocab_size", "seq_len": "max_position_embeddings"},
        "flags": {"tied": ("tie_word_embeddings", False), "bias": ("attention_bias", True),
                  "dropout": ("hidden_dropout", 0.0)},
        "fixed": {"arch": "decoder", "norm": "layer", "mlp": "gelu", "pos": "rope", "tp_family": "gpt",
                  "fused_qkv": True},
    },
    "bert": {
        "shape": {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                  "ffn": "intermediate_size", "vocab": "vocab_size", "seq_len": "max_position_embeddings",
                  "max_pos": "max_position_embeddings", "type_vocab": "type_vocab_size"},
        "flags": {"tied": ("tie_word_embeddings", True), "bias": (None, True),
                  "dropout": ("hidden_dropout_prob", 0.1)},
        "fixed": {"arch": "encoder", "norm": "layer", "mlp": "gelu", "pos": "learned", "embed_norm": True,
                  "tp_family": "gpt"},
    },
    "vit": {
        "shape": {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                  "ffn": "intermediate_size", "image": "image_size", "patch": "patch_size",
                  "channels": "num_channels"},
        "flags": {"bias": ("qkv_bias", True), "dropout": ("hidden_dropout_prob", 0.0)},
        "fixed": {"arch": "vit", "norm": "layer", "mlp": "gelu", "pos": "learned", "vocab": 0,
                  "tp_family": "gpt"},
    },
}


def _read_config(path: Path) -> dict:
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise AutoparError("model", f"config file {str(path)!r} not found",
                           "give the path of a HF config.json (or a zoo name, see `autopar list models`)")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AutoparError("model", f"{path} is not valid JSON ({err})", "give a HF config.json") from err
    if not isinstance(cfg, dict):
        raise AutoparError("model", f"{path} holds a {type(cfg).__name__}, not a JSON object",
                           "give a HF config.json")
    return cfg


def entry_from_hf_config(cfg: dict, name: str) -> dict:
    """A normalized zoo-style entry from a parsed HF config (see ``HF_TYPES``)."""
    mtype = cfg.get("model_type")
    if mtype not in HF_TYPES:
        raise AutoparError("model", f"config model_type {mtype!r} is not supported",
                           f"use one of {', '.join(HF_TYPES)} or a family autopar.models.from_transformers runs, "
                           "or trace the module with pkg.module:factory")
    table = HF_TYPES[mtype]
    impl = cfg.get("attn_implementation", cfg.get("_attn_implementation")) or "sdpa"
    if impl not in ATTN_IMPLEMENTATIONS:
        raise AutoparError("model.attn_implementation", f"unknown attention implementation {impl!r}",
                           f"use one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    entry = {"name": name, "family": mtype, "flash": ATTN_IMPLEMENTATIONS[impl], "pad_vocab_to": 1, **table["fixed"]}
    for field, key in table["shape"].items():
        if cfg.get(key) is not None:
            entry[field] = cfg[key]
    for field, keys in table.get("moe", {}).items():
        for key in (keys,) if isinstance(keys, str) else keys:
            if cfg.get(key) is not None:
                entry[field] = cfg[key]
                break
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    theta = cfg.get("rope_theta", rope.get("rope_theta"))
    if isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0:
        entry["rope_theta"] = theta  # the rotary base (Megatron's --rotary-base)
    scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else rope
    kind = scaling.get("rope_type", scaling.get("type"))
    if isinstance(kind, str) and kind != "default":
        entry["rope_scaling"] = {"type": kind, "factor": scaling.get("factor")}
    for field, (a, b) in table.get("products", {}).items():  # a count of equal parts times their width
        if isinstance(cfg.get(a), int) and isinstance(cfg.get(b), int):
            entry[field] = cfg[a] * cfg[b]
    if "ffn" not in entry and isinstance(entry.get("hidden"), int):
        entry["ffn"] = 4 * entry["hidden"]  # GPT-2's n_inner: null means 4 * hidden
    for field, (key, default) in table["flags"].items():
        entry[field] = bool(cfg.get(key, default)) if key else default
    if mtype == "vit":
        entry.setdefault("channels", 3)
        entry["classes"] = len(cfg.get("id2label") or {}) or 1000
    if "seq_len" in entry and entry["pos"] != "learned":
        entry["seq_len"] = min(entry["seq_len"], DEFAULT_SEQ_CAP)
    for field in ("layers", "hidden", "heads"):
        if not isinstance(entry.get(field), int):
            key = table["shape"][field]
            raise AutoparError(f"model ({name})", f"config field {key!r} is missing or not an integer",
                               f"set {key} in config.json")
    return normalize_entry(entry)


def from_hf_config(path: str | Path, seq_len: int | None = None, dtype_bytes: int | None = None,
                   trace: bool = False) -> ModelSpec:
    """ModelSpec of the HF ``config.json`` at ``path`` (or a directory holding one): from the formulas for the
    ``HF_TYPES`` families, else traced from its transformers model where autopar's units view runs the family
    (``modelspec.hf_traced``). ``trace``: traced for a formula family too (a decoder), so the spec counts what
    ``wrap`` keeps running the transformers model (its own norms and kernels) where the formulas count fused
    kernels (Megatron-core, torchtitan compiled: what ``autopar export`` writes for; docs/models.md).

    ``source`` is the absolute path (``traced:`` before it for a formula family traced), so
    ``load_model(spec.source, spec.seq_len)`` rebuilds it.
    """
    p = Path(path).expanduser()
    cfg = _read_config(p)
    file = (p / "config.json" if p.is_dir() else p).resolve()
    name = str(cfg.get("_name_or_path") or (file.parent.name if file.name == "config.json" else file.stem))
    mtype = cfg.get("model_type")
    if mtype not in HF_TYPES:
        from autopar.modelspec.hf_traced import traceable, traced_from_hf_config

        if traceable(mtype):
            return traced_from_hf_config(cfg, file, name, seq_len=seq_len, dtype_bytes=dtype_bytes)
    entry = entry_from_hf_config(cfg, name)
    if trace:
        from autopar.modelspec.hf_traced import traced_from_hf_config

        if entry["arch"] != "decoder":
            raise AutoparError("--trace", f"model_type {mtype!r} is an {entry['arch']} model; tracing builds the "
                               "config's causal LM", "drop --trace (the formulas count this family)")
        spec = traced_from_hf_config(cfg, file, name, seq_len=seq_len, dtype_bytes=dtype_bytes,
                                     source=TRACED + str(file))
        # the layers are the transformers model's; the shape and the architecture (norm, MLP, positions, family:
        # what autopar export writes) stay the formula entry's, which the traced units do not state
        shape = spec_from_entry(entry, seq_len=spec.seq_len)
        return replace(spec, meta={**shape.meta, **spec.meta}, **{k: getattr(shape, k) for k in SHAPE_FACTS})
    return spec_from_entry(entry, seq_len=seq_len, dtype_bytes=dtype_bytes, source=str(file))


def counts_fused_kernels(spec: ModelSpec) -> bool:
    """Whether ``spec`` is a HF config's decoder counted by the formulas (fused kernels' activations), where
    ``from_hf_config(trace=True)`` would count what ``wrap`` keeps running its transformers model."""
    return spec.meta.get("arch") == "decoder" and "traced" not in spec.meta and spec.source not in zoo_names()
