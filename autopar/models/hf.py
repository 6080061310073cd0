"""Hugging Face ``transformers`` LMs (the Llama-structured families, GPT-2 and its relatives, OPT, BERT MLM, T5) as
units.

``from_transformers(hf_model)`` returns a module whose children are the plan's units and which
shares the HF model's submodules (no copies of weights). Only needed when ``transformers`` is
installed; nothing here imports it.

* Llama-structured (``hf_llama.LLAMA_LIKE``: Llama, Mistral, Qwen2/3, Phi-3, Gemma 1-3, OLMo 1-3, Granite,
  Cohere 1-2, StarCoder2, GLM / GLM-4, SmolLM3, Seed-OSS, EXAONE 4, Apertus, Arcee, ERNIE 4.5, StableLM, Nemotron,
  Helium, VaultGemma, Phi-1/2, Persimmon, Hunyuan (dense), CWM, GPT-J, CodeGen, GPT-NeoX (Pythia: its modules under other names, ``hf_llama.NAMES``; its
  fused QKV is laid out per head, so plain colwise), and the MoE
  Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Granite-MoE, GLM-4.5, ERNIE 4.5 MoE, gpt-oss, DeepSeek-V2 / V3 with their
  latent attention, Granite-MoE with a shared expert, FlexOlmo): ``autopar.models.hf_llama``, with what each family's forward adds to Llama's
  (embedding multipliers, logit scales and soft-caps) as data. Gemma 2 / 3 alternate sliding and full layers;
  Gemma 3's blocks ask its rotary module for their layer type's table. ``use_bidirectional_attention``
  (embedding models) is refused.
* Qwen3: its plan marks the per-head Q/K norms ``replicated_with_grad_allreduce``: each TP rank normalises its
  own heads with the whole weight, so its gradient is a part; autopar's ``tp_grad_sum`` sums it over TP.
* OLMo 2 / 3 (Q/K norms over all heads) and Cohere's per-head Q/K norms: the norms' weights shard with the heads
  (autopar's ``tp_norm``), so the projections are plain colwise / rowwise where HF's OLMo plan gathers them.
* Phi-3 / Phi-4 and GLM / GLM-4: their fused ``qkv_proj`` / ``gate_up_proj`` are held as parts
  (``hf_fused.FusedLinear``, in the HF model itself), each column-parallel under TP; the model's state dict and
  checkpoints keep the fused tensors (its own ``save_pretrained``, and ``load_hf`` / ``save_hf``).
* GPT-2, GPT-BigCode (SantaCoder, StarCoder 1) and GPT-Neo: ``autopar.models.hf_gpt2`` (GPT-2's fused, transposed
  ``c_attn`` held as Q, K and V parts; BigCode's multi-query K / V head whole on every TP rank; GPT-Neo's local attention layers).
* The MoE families: tp = 1 (HF's packed / MoE TP styles are not translated); their packed experts are replicated,
  or split over ``ep`` DP ranks by a plan's ``ep`` (autopar.runtime.expert_parallel; gpt-oss's transposed,
  biased experts with their clamped gate included).
  The router's auxiliary loss is not part of wrap's loss: wrap refuses ``output_router_logits=True``, and
  ``router_jitter_noise > 0`` (random per-token noise no parallel run reproduces); tracing takes both.
* OPT (``OPTForCausalLM``): ``autopar.models.hf_opt`` (learned positions offset by 2, OPT-350M's projections in and
  out and its norms after each sublayer; TP as Megatron's, a head with ``project_out`` at tp 1).
* BLOOM (``BloomForCausalLM``): ``autopar.models.hf_bloom`` (each block's ALiBi biases built for its rank's heads).
* BERT masked LM (``BertForMaskedLM``): ``autopar.models.hf_bert`` (embeddings, encoder layers attending to every
  position (no padding mask), the MLM head; TP as Megatron's BERT). Labels of -100 (unmasked positions) are ignored
  by wrap's loss, as in HF's MLM loss.
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

from torch import nn

from autopar.errors import AutoparError
from autopar.models.hf_bert import bert_view
from autopar.models.hf_bloom import bloom_view
from autopar.models.hf_fused import part_blocks
from autopar.models.hf_gpt2 import GPT2_LIKE, gpt2_like_view
from autopar.models.hf_llama import LLAMA_LIKE, llama_like_view
from autopar.models.hf_opt import opt_view
from autopar.models.hf_units import HFCausalLM

# Causal LM families besides the Llama-structured ones whose view is traced for search (``modelspec.hf_traced``): the
# formulas (``modelspec.hf.HF_TYPES``) do not read them
TRACED_OTHERS = ("opt", "gpt_bigcode", "gpt_neo", "bloom")


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
    view.hf_source = HFSource(hf_names(view, hf_model), part_blocks(view, hf_model), hf_model)
    return view


class HFSource:
    """What ``ParallelModel.load_hf`` / ``save_hf`` need of the transformers model a view was made from: each view
    tensor's names in its state dict (``names``; a part of a fused projection, ``blocks``: the fused tensor's name,
    the dimension its parts are stacked along and the part's first index there, autopar.models.hf_fused), its config
    (and generation config), each state-dict tensor's shape and dtype as the unsplit model has it, and transformers' own inverse of its load-time conversions
    (``revert(state_dict)``: packed MoE experts back to the one-tensor-per-expert names ``save_pretrained`` writes),
    applied to shape-only stand-ins."""

    def __init__(self, names: dict[str, tuple[str, ...]], blocks: dict[str, tuple[str, int, int]],
                 hf_model: nn.Module) -> None:
        self.names, self.blocks, self.config = names, blocks, hf_model.config
        self.generation_config = getattr(hf_model, "generation_config", None)
        self.shapes = {k: (tuple(t.shape), t.dtype) for k, t in hf_model.state_dict().items()}  # fused: one tensor
        try:
            from transformers.core_model_loading import revert_weight_conversion
        except ImportError:  # transformers 4: checkpoints are saved as the modules name them
            self._revert = None
        else:
            self._revert = lambda sd: revert_weight_conversion(hf_model, sd)

    def revert(self, state_dict: dict) -> dict:
        """``state_dict`` under the names (and splits) ``save_pretrained`` writes."""
        return state_dict if self._revert is None else self._revert(state_dict)


def hf_names(view: nn.Module, hf_model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Each parameter and persistent buffer of ``view`` (by its name there) -> its names in ``hf_model``'s state
    dict (what ``save_pretrained`` writes; a tied tensor has two: the checkpoint holds one of them)."""
    # Both state dicts stay alive while they are matched: a fused projection's entry is a tensor made for the call
    # (hf_fused), whose id a freed one's could otherwise take
    hf_state, view_state = hf_model.state_dict(keep_vars=True), view.state_dict(keep_vars=True)
    by_id: dict[int, list[str]] = {}
    for name, t in hf_state.items():  # tied tensors under each of their names
        by_id.setdefault(id(t), []).append(name)
    return {name: tuple(by_id[id(t)]) for name, t in view_state.items() if id(t) in by_id}


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
        return llama_like_view(hf_model)
    if kind in GPT2_LIKE:
        return gpt2_like_view(hf_model)
    if kind == "opt" and type(hf_model).__name__ == "OPTForCausalLM":
        return opt_view(hf_model)
    if kind == "bloom" and type(hf_model).__name__ == "BloomForCausalLM":
        return bloom_view(hf_model)
    if kind == "bert" and hasattr(hf_model, "bert") and hasattr(hf_model, "cls"):
        return bert_view(hf_model)
    raise AutoparError("model", f"transformers model type {kind!r} ({type(hf_model).__name__}) is not supported",
                       f"use one of {', '.join(LLAMA_LIKE + TRACED_OTHERS + ('gpt2',))} causal LMs or "
                       "BertForMaskedLM, or wrap it as an nn.Sequential")
