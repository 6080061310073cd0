"""transformers' Gemma family through the runtime: Gemma (embedding scaled by sqrt(hidden) inside its embedding
module, tied head), Gemma 2 (norms on each sublayer's output, attention and final logit soft-capping, alternating
sliding windows) and Gemma 3 (per-head Q/K norms, a local rotary table for its sliding layers): every strategy
trains as one process does (their logits: tests/models/test_hf_families.py)."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, HF_TINY, same, token_data
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
# Sliding layer then full layer, a window shorter than the test sequences (8), soft caps the logits reach
_WINDOWED = dict(head_dim=8, query_pre_attn_scalar=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
CONFIGS = {
    "gemma": lambda: transformers.GemmaConfig(**HF_TINY),
    "gemma2": lambda: transformers.Gemma2Config(**HF_TINY, **_WINDOWED, attn_logit_softcapping=2.0,
                                                final_logit_softcapping=1.5),
    "gemma3": lambda: transformers.Gemma3TextConfig(**HF_TINY, **_WINDOWED, final_logit_softcapping=1.5),
}
_MODELS = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}


def gemma_model(kind: str):
    model = getattr(transformers, _MODELS[kind])(CONFIGS[kind]())
    with torch.no_grad():  # HF starts Gemma's norms at 0 (a weight of 1 + w): random ones show a misplaced norm
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.5)
    return model


def hf_gemma(kind: str):
    from autopar.models.hf import from_transformers

    return lambda: from_transformers(gemma_model(kind))


def test_the_gemma3_view_keeps_a_rotary_table_per_layer_type():
    from autopar.models.hf import from_transformers

    view = from_transformers(gemma_model("gemma3"))
    assert [b.layer_type for b in view.layers] == ["sliding_attention", "full_attention"]


PLANS = {
    "tp2": [(4, 2, [([0, 1], same(GPT_UNITS, tp=2))])],
    "tp2-sp": [(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])],
    "tp2-dp2-zero3": [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, zero=3))])],
    "pp2-tp2-sp-ckpt": [(2, 4, [([0, 1], same([E, L0], tp=2)), ([2, 3], same([L1, H], tp=2, sp=True, ckpt="full"))])],
    "pp2-dp": [(2, 4, [([0], same([E, L0], zero=1)), ([1], same([L1, H], ckpt="selective"))])],
}


@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_gemma_trains_like_one_process(kind, plan):
    x, y = token_data()
    assert_matches_reference(hf_gemma(kind), make_plan(PLANS[plan]), x, y)


def test_a_bidirectional_gemma3_is_refused_in_one_line():
    from autopar.errors import AutoparError
    from autopar.models.hf import from_transformers

    cfg = transformers.Gemma3TextConfig(**HF_TINY, **_WINDOWED, use_bidirectional_attention=True)
    with pytest.raises(AutoparError, match="use_bidirectional_attention"):
        from_transformers(transformers.Gemma3ForCausalLM(cfg))


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_traced_gemma_equals_its_config(kind, tmp_path):
    """The tracer (what `autopar search --model pkg:factory` reads) and the config formulas agree on every unit."""
    import json

    from autopar.models.hf import from_transformers
    from autopar.modelspec.load import load_model
    from autopar.modelspec.trace import spec_from_module

    model = gemma_model(kind)
    traced = spec_from_module(from_transformers(model), token_data(batch=1, seq=16)[0], dtype_bytes=2)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model.config.model_type,
                                                      **model.config.to_diff_dict()}))
    config = load_model(str(tmp_path / "config.json"), seq_len=16)
    for t, c in zip(traced.layers, config.layers, strict=True):
        assert (t.name, t.params, t.tp_params) == (c.name, c.params, c.tp_params)
        assert t.flops == pytest.approx(c.flops, rel=1e-9)


def meta_gemma(kind: str):
    from autopar.models.hf import from_transformers

    def build():
        with torch.device("meta"):
            return from_transformers(getattr(transformers, _MODELS[kind])(CONFIGS[kind]()))
    return build


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_gemma_built_on_meta(kind):
    """HF's _init_weights per unit sets what the meta device leaves empty: the embedding scale, both rotary tables."""
    x, y = token_data()
    plan = [(2, 4, [([0, 1], same([E, L0], tp=2)), ([2, 3], same([L1, H], tp=2, sp=True))])]
    assert_matches_reference(meta_gemma(kind), make_plan(plan), x, y, meta=True)
