"""transformers' BLOOM through the runtime (autopar.models.hf_bloom): ALiBi biases built per block for the heads its
rank runs, the attention and MLP adding their own residual, a fused QKV laid out per head; the units view gives the
HF logits and every strategy, TP with sequence parallelism included, trains as one process."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, drawn_away, same, token_data, view_logits
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def bloom(**fields):
    """Tiny BLOOM; 6 heads (not a power of two: the slopes of the heads past 4 come from a second series)."""
    cfg = transformers.BloomConfig(**{**dict(vocab_size=64, hidden_size=48, n_layer=2, n_head=6, hidden_dropout=0.0,
                                             attention_dropout=0.0), **fields})
    return drawn_away(transformers.BloomForCausalLM(cfg))


def view(**fields):
    from autopar.models.hf import from_transformers

    return lambda: from_transformers(bloom(**fields).double())


@pytest.mark.parametrize("post", [False, True], ids=["residual-before-norm", "residual-after-norm"])
def test_the_units_view_gives_the_hf_logits(post):
    torch.manual_seed(0)
    torch.testing.assert_close(*view_logits(bloom(apply_residual_connection_post_layernorm=post)))


PLANS = {
    "tp2-sp-zero3": [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])],
    "tp2-zero1": [(4, 2, [([0, 1, 2, 3], [(E, {"tp": 2}), (L0, {"tp": 2, "zero": 1}), (L1, {"tp": 2, "zero": 1}),
                                          (H, {"tp": 2})])])],
    "pp2-tp2-sp-ckpt": [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True, ckpt="full")),
                                ([2, 3], same([L1, H], tp=2, ckpt="selective"))])],
}


@pytest.mark.parametrize("post", [False, True], ids=["residual-before-norm", "residual-after-norm"])
@pytest.mark.parametrize("name", sorted(PLANS))
def test_bloom_trains_like_one_process(name, post):
    x, y = token_data()
    assert_matches_reference(view(tie_word_embeddings=False, apply_residual_connection_post_layernorm=post),
                             make_plan(PLANS[name]), x, y, tol=1e-6)


def test_tp_3_runs_the_heads_past_the_first_power_of_two_series_on_their_own_rank():
    """6 heads over 3 ranks: rank 2 runs heads 4 and 5, whose slopes come from the second series."""
    x, y = token_data()
    plan = make_plan([(4, 2, [([0, 1, 2], same(GPT_UNITS, tp=3))])])
    assert_matches_reference(view(vocab_size=96), plan, x, y, tol=1e-6)  # (a vocabulary tp 3 divides)


def test_bloom_built_on_the_meta_device_trains_like_one_process():
    x, y = token_data()
    assert_matches_reference(view(), make_plan(PLANS["pp2-tp2-sp-ckpt"]), x, y, tol=1e-6, meta=True)


def test_slow_but_exact_is_refused_naming_the_field():
    from autopar.errors import AutoparError
    from autopar.models.hf import from_transformers

    with pytest.raises(AutoparError, match=r"model.config.slow_but_exact: is true with pretraining_tp 2"):
        from_transformers(bloom(slow_but_exact=True, pretraining_tp=2))


def test_search_traces_what_wrap_runs(tmp_path):
    from autopar.modelspec.hf import from_hf_config

    hf = bloom()
    hf.config.save_pretrained(tmp_path)
    spec = from_hf_config(tmp_path / "config.json", seq_len=16)
    assert sum(ly.params for ly in spec.layers) == sum(p.numel() for p in hf.parameters())
    assert spec.layers[1].tp_divisors == (6, 192)
