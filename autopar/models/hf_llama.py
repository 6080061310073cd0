"""The units view of a Llama-structured ``transformers`` causal LM: ``model.embed_tokens``, ``model.layers``
(decoder layers taking ``position_embeddings``), ``model.norm``, ``model.rotary_emb`` and ``lm_head``.

Each family listed in ``LLAMA_LIKE`` has been checked to run its whole forward in those modules, except what
``FORWARD_EXTRAS`` names (a multiplier or dropout on the embeddings, a scale, divisor or soft-cap on the logits,
which its Model / ForCausalLM forward applies): the view applies the same, so its logits equal the HF model's
(tests/models/test_hf_families.py). A family not listed is refused rather than run with a step missing.

* TP plan from the config's ``base_model_tp_plan`` (its colwise / rowwise / replicated_with_grad_allreduce
  entries; a family using another style runs with tp = 1), plus vocabulary-parallel embedding / logits and
  sequence parallelism: the block is split along the sequence, attention and MLP gather their input, and every
  norm the layer holds runs on its shard (``sp_norm_local``: a norm may feed a sublayer or the residual stream).
* Each block gets its own copy of the rotary embedding (no parameters), so a unit never shares a module with
  another; a rotary module that keeps a table per layer type (Gemma 3, OLMo 3) is asked for the block's.
"""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.models.hf_fused import FusedLinear, split_fused
from autopar.models.hf_units import HFCausalLM, block_mask, sliding_window
from autopar.models.tp_plans import HEAD_PLAN, MOE_LOCAL, MULTI_QUERY_PARTS, MULTI_QUERY_WHOLE, entries

DENSE = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2", "olmo3",
         "granite", "cohere", "cohere2", "starcoder2", "glm", "glm4", "smollm3", "seed_oss", "exaone4", "apertus",
         "arcee", "ernie4_5", "gpt_neox", "stablelm", "nemotron", "helium", "vaultgemma", "phi", "persimmon",
         "hunyuan_v1_dense", "cwm", "gptj", "codegen", "falcon")
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "glm4_moe", "ernie4_5_moe", "gpt_oss", "deepseek_v2",
       "deepseek_v3", "granitemoeshared", "flex_olmo")
LLAMA_LIKE = DENSE + MOE

# Where a family keeps the modules Llama names model / embed_tokens / norm / lm_head and each layer's self_attn, and
# the style that gathers the attention's sequence-parallel input (GPT-NeoX's layer passes it positionally)
_LLAMA_NAMES = {"base": "model", "embed": "embed_tokens", "layers": "layers", "norm": "norm", "head": "lm_head",
                "attn": "self_attn", "attn_input": "sp_region_hidden_states"}
_GPTJ_NAMES = {**_LLAMA_NAMES, "base": "transformer", "embed": "wte", "layers": "h", "norm": "ln_f", "attn": "attn"}
NAMES = {"gpt_neox": {**_LLAMA_NAMES, "base": "gpt_neox", "embed": "embed_in", "norm": "final_layer_norm",
                      "attn": "attention", "attn_input": "sp_region"},
         "gptj": _GPTJ_NAMES, "codegen": _GPTJ_NAMES,
         "phi": {**_LLAMA_NAMES, "norm": "final_layernorm"},
         "falcon": {**_GPTJ_NAMES, "embed": "word_embeddings", "attn": "self_attention", "attn_input": "sp_region"},
         "persimmon": {**_LLAMA_NAMES, "norm": "final_layernorm"}}

# What a family's Model / ForCausalLM forward does beyond Llama's, by config field: the embeddings are multiplied
# by ``embed_multiplier`` and dropped out with ``embed_dropout``; the logits multiplied by ``logit_scale``, divided
# by ``logit_divisor`` and soft-capped (``cap * tanh(logits / cap)``) by ``softcap``.
FORWARD_EXTRAS = {
    "gemma2": {"softcap": "final_logit_softcapping"},
    "gemma3_text": {"softcap": "final_logit_softcapping"},
    "granite": {"embed_multiplier": "embedding_multiplier", "logit_divisor": "logits_scaling"},
    "granitemoe": {"embed_multiplier": "embedding_multiplier", "logit_divisor": "logits_scaling"},
    "granitemoeshared": {"embed_multiplier": "embedding_multiplier", "logit_divisor": "logits_scaling"},
    "cohere": {"logit_scale": "logit_scale"},
    "cohere2": {"logit_scale": "logit_scale"},
    "starcoder2": {"embed_dropout": "embedding_dropout"},
    "gpt_neox": {"embed_dropout": "hidden_dropout"},
    "phi": {"embed_dropout": "embd_pdrop"},
    "gptj": {"embed_dropout": "embd_pdrop"},
    "codegen": {"embed_dropout": "embd_pdrop"},
    "vaultgemma": {"softcap": "final_logit_softcapping"},
}

# Families whose attention computes its scores itself instead of calling transformers' attention interface, which
# context parallel replaces (autopar.runtime.context_parallel): they run without CP
OWN_ATTENTION = ("falcon",)
# Arguments a family's decoder layer takes besides Llama's (Falcon's ALiBi tensor, None: its rotary variants)
BLOCK_KWARGS = {"falcon": {"alibi": None}}
# Config settings under which a family is refused, with why: Falcon-RW's ALiBi biases come in through the mask its
# model's forward builds, which the units view does not build
REFUSED_WHEN = {"falcon": ("alibi", "adds ALiBi position biases through the mask its model's forward builds, which "
                           "autopar's units view does not build", "use a Falcon with rotary positions (alibi: false)")}

# autopar's entries over a family's HF TP plan (same key: autopar's wins; a module the block lacks: dropped), or its
# whole plan where transformers ships none (StableLM, Persimmon, Hunyuan).
# OLMo 2 / 3 normalise Q and K over all heads, so HF's plan gathers every projection's output and runs attention
# whole on each rank; here the norms run on the heads' shards (tp_norm) and the projections stay colwise / rowwise.
# Cohere's per-head Q/K norms (use_qk_norm) shard with their heads; Phi's, Persimmon's and Hunyuan's are one norm
# over head_dim every head shares, so each rank's gradient is a part, as Qwen3's. Apertus's learned xIELU activation
# sits between the column- and row-parallel MLP halves, which HF's plan leaves out: each rank sees its shard, so sum
# its gradient. StableLM's qk_layernorm keeps one norm per head in a list: each rank runs its heads' slice and sums
# the gradients (head_norm_list). Persimmon's fused query_key_value is laid out per head ([heads, 3, head_dim] rows), as GPT-NeoX's;
# Falcon's per KV group ([kv heads, queries per group + 2, head_dim] rows; 40B / 180B's new decoder architecture),
# or per head, or (Falcon-7B's multi-query: MULTI_QUERY) as every query then one K and one V head every rank needs.
# Phi-3's and GLM's fused projections are held as parts (FUSED), so the projections after them are plain rowwise
# where HF's plan gathers the fused outputs and splits them again (colwise_gather_output / rowwise_split_input).
_QKVO = {**{f"layer.self_attn.{m}_proj": "colwise" for m in "qkv"}, "layer.self_attn.o_proj": "rowwise"}
_SWIGLU = {"layer.mlp.gate_proj": "colwise", "layer.mlp.up_proj": "colwise", "layer.mlp.down_proj": "rowwise"}
_QK_NORMS = {"layer.self_attn.q_norm": "tp_norm", "layer.self_attn.k_norm": "tp_norm"}
_QK_NORMED_ATTENTION = {**_QKVO, **_QK_NORMS}
TP_EXTRAS = {"olmo2": _QK_NORMED_ATTENTION, "olmo3": _QK_NORMED_ATTENTION, "cohere": _QK_NORMS,
             "olmoe": _QK_NORMED_ATTENTION, "flex_olmo": _QK_NORMED_ATTENTION, "granitemoe": _QKVO,
             "granitemoeshared": _QKVO,
             "phi": {"layer.self_attn.q_layernorm": "tp_grad_sum", "layer.self_attn.k_layernorm": "tp_grad_sum"},
             "apertus": {"layer.mlp.act_fn": "tp_grad_sum"},
             "stablelm": {**_QKVO, **_SWIGLU, "layer.self_attn.q_layernorm": "head_norm_list+tp_grad_sum",
                          "layer.self_attn.k_layernorm": "head_norm_list+tp_grad_sum"},
             "hunyuan_v1_dense": {**_QKVO, **_SWIGLU, "layer.self_attn.query_layernorm": "tp_grad_sum",
                                  "layer.self_attn.key_layernorm": "tp_grad_sum"},
             "persimmon": {"layer.self_attn.query_key_value": "colwise", "layer.self_attn.dense": "rowwise",
                           "layer.self_attn.q_layernorm": "tp_grad_sum", "layer.self_attn.k_layernorm": "tp_grad_sum",
                           "layer.mlp.dense_h_to_4h": "colwise", "layer.mlp.dense_4h_to_h": "rowwise"},
             "falcon": {"layer.self_attention.query_key_value": "colwise", "layer.self_attention.dense": "rowwise",
                        "layer.mlp.dense_h_to_4h": "colwise", "layer.mlp.dense_4h_to_h": "rowwise"},
             "phi3": {"layer.self_attn.o_proj": "rowwise", "layer.mlp.down_proj": "rowwise"},
             "glm": {"layer.mlp.down_proj": "rowwise"}, "glm4": {"layer.mlp.down_proj": "rowwise"}}
# Fused projections each block holds as their parts (autopar.models.hf_fused), by path and layout: under TP every
# part is column-parallel, and the row-parallel projection after it takes the rank's share as any other
FUSED = {"phi3": {"self_attn.qkv_proj": "qkv", "mlp.gate_up_proj": "halves"}, "glm": {"mlp.gate_up_proj": "halves"},
         "glm4": {"mlp.gate_up_proj": "halves"}}
# Multi-query variants (one K and V head which every rank's query heads read): family -> (whether a config is one,
# the fused QKV). The fused projection is held as the queries and the K and V head (tp_plans.MULTI_QUERY_PARTS); the
# attention gets the rank's query heads (local_queries)
MULTI_QUERY = {"falcon": (lambda cfg: cfg.multi_query and not cfg.new_decoder_architecture,
                          "self_attention.query_key_value")}
# Modules whose output their layer modifies in place (Falcon's mlp_output += attention_output; OLMo's clip_qkv clamps
# the projections with clamp_): under TP they give a copy (the writable_output style), as a row- or column-parallel
# output is a view autograd forbids writing to. Family -> (the config field that makes it so, None: always; modules)
WRITABLE_OUTPUT = {"falcon": (None, ("mlp",)),
                   "olmo": ("clip_qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))}
# Families whose attention reshapes by its head counts rather than by -1: under TP it is given the rank's counts
# (the local_heads style, autopar.runtime.tensor_parallel); Phi-3 splits its fused QKV at config.num_attention_heads
LOCAL_HEADS = ("stablelm", "persimmon", "phi3", "falcon")
# Counts a family's TP degree must divide besides its heads and FFN width: CodeGen's qkv_proj holds its Q, V, K as
# 4 blocks (its attention's mp_num), each rank needing whole blocks
TP_DIVIDES = {"codegen": (4,)}

# HF style name -> autopar style name (autopar/models/tp_plans.py)
_HF_STYLES = {"colwise": "colwise", "rowwise": "rowwise", "replicated_with_grad_allreduce": "tp_grad_sum"}


class HFTokenEmbed(nn.Module):
    """Token embedding (Gemma's module scales by sqrt(hidden) itself), times ``multiplier``, then dropout ``p``."""

    def __init__(self, tok: nn.Embedding, multiplier: float | None = None, p: float = 0.0) -> None:
        super().__init__()
        self.tok, self.multiplier = tok, multiplier
        self.dropout = nn.Dropout(p) if p else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.multiplier is not None:
            x = x * self.multiplier
        return x if self.dropout is None else self.dropout(x)


class HFRotaryBlock(nn.Module):
    """A Llama-like decoder layer plus the rotary table it needs (computed for the full sequence).

    ``cp_attention``: set by the runtime under context parallel (autopar.runtime.context_parallel):
    the block then holds this rank's tokens, takes their true positions and mask, and its attention runs
    through the ``autopar_cp`` attention function (K and V gathered over the CP group)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module, layer_type: str | None = None,
                 attn: str = "self_attn", extra: dict | None = None) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary
        self.layer_type = layer_type  # Gemma 3: the rotary table differs between sliding and full layers
        self.attn_name = attn  # the layer's attention module (``self_attn``; GPT-NeoX: ``attention``)
        self.extra = dict(extra or {})  # arguments the family's layer takes besides Llama's (BLOCK_KWARGS)
        self.cp_attention = None

    @property
    def attention(self) -> nn.Module:
        return getattr(self.layer, self.attn_name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cpg = self.cp_attention
        if cpg is None:
            pos, mask = torch.arange(x.shape[1], device=x.device)[None], block_mask(self.attention, x)
        else:
            pos, mask = cpg.hf_positions_and_mask(x, sliding_window(self.attention))
            self.attention.autopar_cp = cpg  # read by the autopar_cp attention function
        # (cos, sin), or DeepSeek-V2's one complex table: passed on as the model's rotary module gives it
        emb = self.rotary(x, pos) if self.layer_type is None else self.rotary(x, pos, self.layer_type)
        out = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=emb, **self.extra)
        return out[0] if isinstance(out, tuple) else out


class HFHead(nn.Module):
    """Final norm and LM head, then what the family's ForCausalLM applies to the logits, in its order: times
    ``scale``, divided by ``divisor``, soft-capped by ``softcap`` (elementwise, so vocabulary shards do it alike)."""

    def __init__(self, norm: nn.Module, proj: nn.Linear, softcap: float | None = None, scale: float | None = None,
                 divisor: float | None = None) -> None:
        super().__init__()
        self.norm, self.proj, self.softcap, self.scale, self.divisor = norm, proj, softcap, scale, divisor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.proj(self.norm(x))
        if self.scale is not None:
            logits = logits * self.scale
        if self.divisor is not None:
            logits = logits / self.divisor
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def block_plan(cfg, layers: list[nn.Module], names: dict[str, str] = _LLAMA_NAMES) -> dict[str, str] | None:
    """The blocks' TP plan: HF's entries translated (plus ``TP_EXTRAS``), sequence parallelism around them.

    None (tp = 1 only): no plan, a style autopar does not translate, or a block whose
    attention or MLP holds a parameter the plan neither shards nor sums (TP would train it on a part of its input
    without syncing: the routed experts of an MoE model's later
    blocks when its first ones are dense), or lacks a module the plan names."""
    kind = cfg.model_type
    raw = getattr(cfg, "base_model_tp_plan", None) or {}
    prefix = f"{names['layers']}.*."
    moe = kind in MOE
    if moe:  # the attention's entries only: every other sublayer stays whole, on the rank's tokens (moe_local)
        raw = {key: style for key, style in raw.items() if key.startswith(f"{prefix}{names['attn']}.")}
    if not (raw or TP_EXTRAS.get(kind)):
        return None
    present = dict(layers[0].named_modules(prefix="layer"))
    fused = {fqn: len(m.parts) for fqn, m in present.items() if isinstance(m, FusedLinear)}
    mq = multi_query_path(cfg)
    part_styles = {fqn: MULTI_QUERY_PARTS if fqn == f"layer.{mq}" else ("colwise",) * n for fqn, n in fused.items()}
    plan = {**{"layer." + key[len(prefix):]: _HF_STYLES.get(style) for key, style in raw.items()
               if key.startswith(prefix) and "layer." + key[len(prefix):] not in fused},  # HF styles the fused whole
            **{f"{fqn}.parts.{i}": style for fqn, styles in part_styles.items() for i, style in enumerate(styles)},
            **{fqn: style for fqn, style in TP_EXTRAS.get(kind, {}).items() if fqn in present and fqn not in fused},
            **({f"layer.{mq}": MULTI_QUERY_WHOLE} if mq else {})}
    if None in plan.values():
        return None  # a style autopar does not translate: run this architecture with tp = 1
    attn = f"layer.{names['attn']}"
    norms = {f"layer.{name}": "sp_norm_local" for name, m in layers[0].named_children() if "Norm" in type(m).__name__}
    # An MoE family's router and experts (and a dense-first block's MLP) run per token: whole on every rank, on the
    # rank's sequence shard, their gradients summed over TP (Megatron's expert TP 1 under sequence parallelism)
    local = {f"layer.{name}": MOE_LOCAL for name, m in layers[0].named_children()
             if moe and f"layer.{name}" not in norms and name != names["attn"] and any(True for _ in m.parameters())}
    if not all(_covered({**plan, **local}, layer, attn) for layer in layers):
        return None
    attn_style = names["attn_input"] + ("+local_queries" if mq else "+local_heads" if kind in LOCAL_HEADS else "")
    styles = {"layer": "sp_unit", attn: attn_style, **({} if moe else {"layer.mlp": "sp_region"}), **norms, **plan,
              **local}
    when, modules = WRITABLE_OUTPUT.get(kind, (None, ()))
    for name in modules if when is None or getattr(cfg, when, None) is not None else ():
        styles[f"layer.{name}"] = f"{styles[f'layer.{name}']}+writable_output"
    return styles


def multi_query_path(cfg) -> str | None:
    """The fused QKV (relative to the HF layer) of a ``MULTI_QUERY`` family's multi-query config; None otherwise."""
    when, path = MULTI_QUERY.get(cfg.model_type, (None, None))
    return path if when is not None and when(cfg) else None


def _covered(plan: dict[str, str], layer: nn.Module, attn: str) -> bool:
    """Whether ``plan`` names only modules ``layer`` has and shards or sums every parameter of its attention
    (``attn``) and MLP (a ``tp_grad_sum`` entry sums its children's too)."""
    modules = dict(layer.named_modules(prefix="layer"))
    if any(fqn not in modules for fqn in plan):
        return False
    summed = tuple(f"{fqn}." for fqn, style in entries(plan) if style in ("tp_grad_sum", MOE_LOCAL))
    return all(plan.get(fqn) is not None or fqn.startswith(summed) or not any(True for _ in m.parameters(recurse=False))
               for fqn, m in modules.items() if fqn.startswith((attn, "layer.mlp")))


def _extra(cfg, kind: str, what: str):
    field = FORWARD_EXTRAS.get(kind, {}).get(what)
    return getattr(cfg, field, None) if field else None


def llama_like_view(hf_model: nn.Module) -> HFCausalLM:
    """Units view (``embed``, ``layers.i``, ``head``) of a ``LLAMA_LIKE`` family's causal LM (shares its modules)."""
    cfg, kind = hf_model.config, hf_model.config.model_type
    if getattr(cfg, "use_bidirectional_attention", False):
        raise AutoparError("model.config.use_bidirectional_attention", f"is true: this {kind} attends to both "
                           "sides (an embedding model), which autopar's causal units view would not reproduce",
                           "set it to false for a causal LM")
    if kind in REFUSED_WHEN and getattr(cfg, REFUSED_WHEN[kind][0], None):
        field, why, fix = REFUSED_WHEN[kind]
        raise AutoparError(f"model.config.{field}", f"is set: this {kind} {why}", fix)
    names = NAMES.get(kind, _LLAMA_NAMES)
    base = getattr(hf_model, names["base"])
    embed = HFTokenEmbed(getattr(base, names["embed"]), _extra(cfg, kind, "embed_multiplier"),
                         _extra(cfg, kind, "embed_dropout") or 0.0)
    hf_layers = list(getattr(base, names["layers"]))
    mq = multi_query_path(cfg)
    for layer in hf_layers:
        split_fused(layer, {mq: "query_then_kv"} if mq else FUSED.get(kind, {}), cfg)
    per_type = "layer_type" in inspect.signature(base.rotary_emb.forward).parameters
    types = cfg.layer_types if per_type else None
    layers = [HFRotaryBlock(layer, copy.deepcopy(base.rotary_emb), types[i] if types else None, names["attn"],
                            BLOCK_KWARGS.get(kind)) for i, layer in enumerate(hf_layers)]
    head = HFHead(getattr(base, names["norm"]), getattr(hf_model, names["head"]), _extra(cfg, kind, "softcap"),
                  _extra(cfg, kind, "logit_scale"), _extra(cfg, kind, "logit_divisor"))
    block = block_plan(cfg, hf_layers, names)
    plans = {"embed": {"tok": "vocab_embed"} if block else None, "block": block,
             "head": HEAD_PLAN if block else None}
    attn0 = getattr(hf_layers[0], names["attn"])  # Falcon keeps its effective KV head count (1: multi-query) here
    kv = getattr(attn0, "num_kv_heads", None) or getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    kv = () if mq else (kv,)  # a multi-query K / V head is whole on every rank: no limit
    ffn = (getattr(cfg, "ffn_hidden_size", None) or getattr(cfg, "intermediate_size", None)  # Falcon: ffn_hidden_size
           or getattr(cfg, "n_inner", None) or 4 * cfg.hidden_size)  # GPT-J / CodeGen: n_inner
    divisors = {"embed": (cfg.vocab_size,), "head": (cfg.vocab_size,),  # an MoE family's MLP stays whole under TP
                "block": (cfg.num_attention_heads, *kv, *(() if kind in MOE else (ffn,)), *TP_DIVIDES.get(kind, ()))}
    view = HFCausalLM(embed, layers, head, f"hf-{kind}", plans, divisors, {"block": (f"layer.{names['attn']}",)})
    # MoE blocks too (their routed experts run on the rank's tokens, ep 1 under CP); not a family whose attention is
    # its own code rather than transformers' attention interface, through which CP runs (Falcon)
    view.context_parallel = kind not in OWN_ATTENTION
    return view
