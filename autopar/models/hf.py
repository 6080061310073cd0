"""Hugging Face ``transformers`` LMs (Llama family, Qwen2/3, Gemma 1-3, Phi-3, Mixtral, Qwen-MoE, GPT-2, BERT MLM, T5)
as units.

``from_transformers(hf_model)`` returns a module whose children are the plan's units and which
shares the HF model's submodules (no copies of weights). Only needed when ``transformers`` is
installed; nothing here imports it.

* Llama-like (``llama``, ``mistral``, ``qwen2``, ``qwen3``): TP plan from the config's ``base_model_tp_plan``
  (the colwise / rowwise entries HF ships), plus vocabulary-parallel embedding / logits and
  sequence-parallel norms as in autopar's own Llama. Each block gets its own copy of the rotary
  embedding (no parameters), so a unit never shares a module with another.
* Gemma (``gemma``, ``gemma2``, ``gemma3_text``): Llama-like. Its embedding module scales by sqrt(hidden) itself;
  Gemma 2 / 3 normalise each sublayer's output before the residual add (``sp_norm_local`` under sequence
  parallelism), soft-cap the logits after the head (``HFHead``'s ``softcap``, as their ForCausalLM does) and
  alternate sliding and full layers; Gemma 3's blocks ask its rotary module for their layer type's table (a local
  base on sliding layers). ``use_bidirectional_attention`` (embedding models) is refused.
* Qwen3: its plan marks the per-head Q/K norms ``replicated_with_grad_allreduce``: each TP rank normalises its
  own heads with the whole weight, so its gradient is a part; autopar's ``tp_grad_sum`` sums it over TP.
* Phi-3: tp = 1 only (HF's colwise_gather_output / rowwise_split_input styles on its fused qkv_proj and
  gate_up_proj are not translated).
* GPT-2: tp = 1 only (its fused ``c_attn`` cannot be split by heads with a plain column split).
* Mixtral, Qwen2-MoE, Qwen3-MoE: Llama-like, tp = 1 (HF's packed / MoE TP styles are not translated); their packed
  experts are replicated, or split over ``ep`` DP ranks by a plan's ``ep`` (autopar.runtime.expert_parallel).
  The router's auxiliary loss is not part of wrap's loss: wrap refuses ``output_router_logits=True``, and
  ``router_jitter_noise > 0`` (random per-token noise no parallel run reproduces); tracing takes both.
* BERT masked LM (``BertForMaskedLM``): embeddings, encoder layers attending to every position (no
  padding mask), the MLM head; tp = 1. Labels of -100 (unmasked positions) are ignored by wrap's loss,
  as in HF's MLM loss.
* T5 (``T5ForConditionalGeneration``): encoder and decoder blocks passing (encoder, decoder) state
  pairs, inputs ``[B, 2, S]`` (autopar.models.hf_seq2seq); other encoder-decoder families are refused.

Tied input / output embeddings (GPT-2, ``tie_word_embeddings``) stay tied: the embed and head units
share the one tensor, as in the HF model; ``wrap`` keeps a synchronised copy per unit
(autopar.runtime.ties), so training equals the tied single-process model.

Blocks get an explicit causal mask where their attention implementation needs one (eager), none where it
masks causally itself (SDPA, flash: ``hf_units.block_mask``), which keeps SDPA on its flash kernel. Selective
checkpointing recomputes the whole attention module: HF's attention core is a function, not a module.
Build the HF model with real weights (same seed on every rank, or ``from_pretrained``), or on the
meta device (``with torch.device("meta"): AutoModelForCausalLM.from_config(cfg)``): ``wrap`` then
materialises each rank's units with the HF model's own ``_init_weights`` (autopar.runtime.materialize;
a tied head gets the embedding's value).
"""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.models.hf_units import HFCausalLM, block_mask, sliding_window

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "phi3", "mixtral", "qwen2_moe", "qwen3_moe", "gemma", "gemma2",
              "gemma3_text")
MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
# HF style name -> autopar style name (autopar/models/tp_plans.py)
_HF_STYLES = {"colwise": "colwise", "rowwise": "rowwise", "replicated_with_grad_allreduce": "tp_grad_sum"}
_LLAMA_SP = {
    "layer": "sp_unit",
    "layer.input_layernorm": "sp_norm",
    "layer.self_attn": "sp_region_hidden_states",
    "layer.post_attention_layernorm": "sp_norm",
    "layer.mlp": "sp_region",
}
# Gemma 2 / 3 normalise each sublayer's output before the residual add (so that norm's output must be a plain
# tensor under sequence parallelism) and the MLP's input with a norm of its own
_GEMMA2_SP = {
    "layer.post_attention_layernorm": "sp_norm_local",
    "layer.pre_feedforward_layernorm": "sp_norm",
    "layer.post_feedforward_layernorm": "sp_norm_local",
}


class HFTokenEmbed(nn.Module):
    def __init__(self, tok: nn.Embedding) -> None:
        super().__init__()
        self.tok = tok

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)


class HFGPT2Embed(nn.Module):
    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.drop(self.wte(tokens) + self.wpe(positions))


class HFRotaryBlock(nn.Module):
    """A Llama-like decoder layer plus the rotary table it needs (computed for the full sequence).

    ``cp_attention``: set by the runtime under context parallel (autopar.runtime.context_parallel):
    the block then holds this rank's tokens, takes their true positions and mask, and its attention runs
    through the ``autopar_cp`` attention function (K and V gathered over the CP group)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module, layer_type: str | None = None) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary
        self.layer_type = layer_type  # Gemma 3: the rotary table differs between sliding and full layers
        self.cp_attention = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cpg = self.cp_attention
        if cpg is None:
            pos, mask = torch.arange(x.shape[1], device=x.device)[None], block_mask(self.layer.self_attn, x)
        else:
            pos, mask = cpg.hf_positions_and_mask(x, sliding_window(self.layer.self_attn))
            self.layer.self_attn.autopar_cp = cpg  # read by the autopar_cp attention function
        cos, sin = self.rotary(x, pos) if self.layer_type is None else self.rotary(x, pos, self.layer_type)
        out = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out


class HFBlock(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x, attention_mask=block_mask(self.block.attn, x))
        return out[0] if isinstance(out, tuple) else out


class HFBertEmbed(nn.Module):
    """BERT's embeddings (word + position + token type 0, LayerNorm, dropout) of token ids."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids=tokens)


class HFBidirectionalBlock(nn.Module):
    """An encoder layer attending to every position (no mask: as the HF model without padding)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


class HFHead(nn.Module):
    """Final norm and LM head; ``softcap``: Gemma 2's final logit soft-capping, ``cap * tanh(logits / cap)``,
    which its ForCausalLM applies after the head (elementwise, so vocabulary shards cap alike)."""

    def __init__(self, norm: nn.Module, proj: nn.Linear, softcap: float | None = None) -> None:
        super().__init__()
        self.norm, self.proj, self.softcap = norm, proj, softcap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.proj(self.norm(x))
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap


def _llama_block_plan(cfg, layer: nn.Module) -> dict[str, str] | None:
    raw = getattr(cfg, "base_model_tp_plan", None) or {}
    plan = {}
    for key, style in raw.items():
        if not key.startswith("layers.*."):
            continue
        if style not in _HF_STYLES:
            return None  # a style autopar does not translate: run this architecture with tp = 1
        plan["layer." + key[len("layers.*."):]] = _HF_STYLES[style]
    if not plan:
        return None
    sp = dict(_LLAMA_SP)
    if hasattr(layer, "post_feedforward_layernorm"):  # Gemma 2 / 3: the norms of the sublayer outputs
        sp.update(_GEMMA2_SP)
    return {**sp, **plan}


def is_transformers_model(model: nn.Module) -> bool:
    """True for a module defined by the ``transformers`` package (checked without importing it)."""
    return type(model).__module__.startswith("transformers.")


def units_view(model: nn.Module) -> nn.Module:
    """``model``, or ``from_transformers(model)`` for a transformers model: what wrap and the tracer run.

    Both call this, so a raw Hugging Face model is searched and wrapped under the same unit names
    (``embed``, ``layers.i``, ``head``) and its own weights.
    """
    return from_transformers(model) if is_transformers_model(model) else model


def from_transformers(hf_model: nn.Module) -> HFCausalLM:
    """Units view of a ``transformers`` causal LM (shares its modules). Raises AutoparError if unsupported.

    The view's ``init_module`` is the HF model's ``_init_weights``: a view built on the meta device
    is materialised with HF's own initialisation (autopar.runtime.materialize).
    """
    view = _view(hf_model)
    view.init_module = getattr(hf_model, "_init_weights", None)
    return view


def _view(hf_model: nn.Module) -> HFCausalLM:
    cfg = hf_model.config
    kind = cfg.model_type
    if kind == "t5" and type(hf_model).__name__ == "T5ForConditionalGeneration":
        from autopar.models.hf_seq2seq import t5_view

        return t5_view(hf_model)
    if getattr(cfg, "is_encoder_decoder", False):
        raise AutoparError("model", f"transformers model type {kind!r} ({type(hf_model).__name__}) is an encoder-decoder "
                           "(seq2seq) model other than T5ForConditionalGeneration, which autopar does not run: its decoder "
                           "blocks read the encoder's output, not only the previous unit's output",
                           "use T5ForConditionalGeneration, a decoder-only causal LM or BertForMaskedLM, or write the "
                           "model as a chain of units that pass (encoder states, decoder states) tuples")
    if kind in LLAMA_LIKE:
        if getattr(cfg, "use_bidirectional_attention", False):
            raise AutoparError("model.config.use_bidirectional_attention", f"is true: this {kind} attends to both "
                               "sides (an embedding model), which autopar's causal units view would not reproduce",
                               "set it to false for a causal LM")
        base = hf_model.model
        embed = HFTokenEmbed(base.embed_tokens)  # Gemma's scales by sqrt(hidden) itself (TextScaledWordEmbedding)
        # Gemma 3 keeps a rotary table per layer type (local base for sliding layers) and asks for the type
        per_type = "layer_type" in inspect.signature(base.rotary_emb.forward).parameters
        types = cfg.layer_types if per_type else None
        layers = [HFRotaryBlock(layer, copy.deepcopy(base.rotary_emb), types[i] if types else None)
                  for i, layer in enumerate(base.layers)]
        head = HFHead(base.norm, hf_model.lm_head, getattr(cfg, "final_logit_softcapping", None))
        block = _llama_block_plan(cfg, base.layers[0])
        plans = {"embed": {"tok": "vocab_embed"} if block else None, "block": block,
                 "head": {"": "sp_unit_in", "norm": "sp_norm", "proj": "logits"} if block else None}
        divisors = {"embed": (cfg.vocab_size,), "head": (cfg.vocab_size,),
                    "block": (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size)}
        view = HFCausalLM(embed, layers, head, f"hf-{kind}", plans, divisors, {"block": ("layer.self_attn",)})
        view.context_parallel = kind not in MOE  # the MoE blocks' expert parallel is not combined with CP
        return view
    if kind == "gpt2":
        base = hf_model.transformer
        embed = HFGPT2Embed(base.wte, base.wpe, base.drop)
        head = HFHead(base.ln_f, hf_model.lm_head)
        return HFCausalLM(embed, [HFBlock(b) for b in base.h], head, "hf-gpt2",
                          {"embed": None, "block": None, "head": None}, {}, {"block": ("block.attn",)})
    if kind == "bert" and hasattr(hf_model, "bert") and hasattr(hf_model, "cls"):
        base = hf_model.bert
        layers = [HFBidirectionalBlock(b) for b in base.encoder.layer]
        return HFCausalLM(HFBertEmbed(base.embeddings), layers, hf_model.cls, "hf-bert",
                          {"embed": None, "block": None, "head": None}, {}, {"block": ("block.attention",)})
    raise AutoparError("model", f"transformers model type {kind!r} ({type(hf_model).__name__}) is not supported",
                       f"use one of {', '.join(LLAMA_LIKE + ('gpt2',))} causal LMs or BertForMaskedLM, or wrap it "
                       "as an nn.Sequential")
