"""Context parallel on the dense Hugging Face Llama-like families beyond Llama: each trains under CP as one
process does. What each adds over Llama: Qwen3's per-head Q/K norms; Mistral's sliding window on every layer;
Gemma 2's eager attention with soft-capped scores and alternating windows; Gemma 3's local rotary table on its
sliding layers; Phi-3's fused projections; OLMo 2's and Cohere's Q/K norms on TP head shards. The windows are shorter than the sequence, so a CP mask without them
would differ."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, HF_TINY, same, token_data
from tests.runtime.reference import assert_matches_reference, wrap_outcomes

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
_WINDOWED = dict(head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
CONFIGS = {  # name -> (config class, model class, config fields)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, tie_word_embeddings=False)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=4)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(**_WINDOWED, query_pre_attn_scalar=8,
                                                        attn_logit_softcapping=2.0, final_logit_softcapping=1.5)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(**_WINDOWED, query_pre_attn_scalar=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=4, pad_token_id=0)),  # fused projections as parts
    # Q/K norms on head shards under TP (tp_norm): OLMo 2's over all heads, Cohere's per head
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(pad_token_id=0)),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(use_qk_norm=True, logit_scale=0.3, pad_token_id=0)),
}


def hf_model(name: str):
    from autopar.models.hf import from_transformers

    def build():
        cfg_cls, model_cls, fields = CONFIGS[name]
        model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**HF_TINY, **fields))
        with torch.no_grad():  # norms away from their initial values: a norm applied to the wrong tokens shows
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.normal_(0.5, 0.5)
        return from_transformers(model.double())
    return build


def _plan(pipelines):
    plan = make_plan(pipelines)
    plan.model.seq_len = 8
    return plan


PLANS = {
    "cp2": [(4, 2, [([0, 1], same(GPT_UNITS, cp=2))])],
    "cp2-tp2": [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, cp=2, tp=2))])],
    "cp2-pp2-ckpt": [(4, 2, [([0, 1], same([E, L0], cp=2)), ([2, 3], same([L1, H], cp=2, ckpt="full"))])],
}
CASES = [(m, p) for m in sorted(CONFIGS) for p in sorted(PLANS)]


@pytest.mark.parametrize(("model", "plan"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_hf_family_under_context_parallel_trains_like_one_process(model, plan):
    """In float64: Gemma's norms compute in float32 inside the model, whose rounding differs with the tensor
    shapes CP runs (2e-10 on Gemma 3's weights here, 1.5e-5 in float32); a wrong mask or position differs by far
    more. The losses are compared as float32 (1e-6)."""
    x, y = token_data()
    assert_matches_reference(hf_model(model), _plan(PLANS[plan]), x, y, tol=1e-6)


def test_a_family_with_its_own_attention_under_cp_is_refused_naming_its_type():
    """Falcon computes its attention scores itself, not through the attention interface CP replaces: a CP run would
    attend over each rank's own tokens only, so the plan is refused (autopar.models.hf_llama.OWN_ATTENTION)."""
    def falcon():
        from autopar.models.hf import from_transformers

        cfg = transformers.FalconConfig(**HF_TINY, new_decoder_architecture=True, num_kv_heads=2)
        return from_transformers(transformers.FalconForCausalLM(cfg))

    outcomes = wrap_outcomes(falcon, _plan(PLANS["cp2"]))
    assert all("hf-falcon has none" in o and o.count("\n") == 0 for o in outcomes), outcomes
