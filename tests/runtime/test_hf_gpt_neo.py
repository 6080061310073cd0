"""transformers' GPT-Neo (GPT-Neo 125M-2.7B, the TinyStories models) through the runtime (autopar.models.hf_gpt2):
global and local (windowed) attention layers, learned positions, its attention module inside the block's; the units
view gives the HF logits and every strategy, TP with sequence parallelism included, trains as one process."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, drawn_away, same, token_data, view_logits
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def gpt_neo(**fields):
    """Tiny GPT-Neo: a global then a local layer whose window (4) is shorter than the test sequence (8)."""
    cfg = transformers.GPTNeoConfig(**{**dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                                              attention_types=[[["global", "local"], 1]], window_size=4,
                                              max_position_embeddings=16, intermediate_size=64, embed_dropout=0.0,
                                              attention_dropout=0.0, resid_dropout=0.0), **fields})
    return drawn_away(transformers.GPTNeoForCausalLM(cfg))


def view(**fields):
    from autopar.models.hf import from_transformers

    return lambda: from_transformers(gpt_neo(**fields).double())


def test_the_units_view_gives_the_hf_logits():
    torch.manual_seed(0)
    got, want = view_logits(gpt_neo())
    torch.testing.assert_close(got, want)
    assert not torch.allclose(view_logits(gpt_neo(window_size=16))[0], want)  # the window matters here


PLANS = {
    "tp2-sp-zero1": [(4, 2, [([0, 1, 2, 3], [(E, {"tp": 2}), (L0, {"tp": 2, "sp": True, "zero": 1}),
                                             (L1, {"tp": 2, "sp": True, "zero": 1}), (H, {"tp": 2, "sp": True})])])],
    "pp2-tp2-zero3-ckpt": [(2, 4, [([0, 1], same([E, L0], tp=2, zero=3, ckpt="full")),
                                   ([2, 3], same([L1, H], tp=2, sp=True, ckpt="selective"))])],
    "dp4-zero3": [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, zero=3))])],
}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("name", sorted(PLANS))
def test_gpt_neo_trains_like_one_process(name, tied):
    x, y = token_data()
    plan = PLANS[name]
    if tied and name == "tp2-sp-zero1":  # the runtime syncs a tied copy under TP or ZeRO-1/2, not both
        plan = [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]
    assert_matches_reference(view(tie_word_embeddings=tied), make_plan(plan), x, y, tol=1e-6)


def test_search_traces_what_wrap_runs(tmp_path):
    from autopar.modelspec.hf import from_hf_config

    hf = gpt_neo(intermediate_size=48)
    hf.config.save_pretrained(tmp_path)
    spec = from_hf_config(tmp_path / "config.json", seq_len=16)
    assert sum(ly.params for ly in spec.layers) == sum(p.numel() for p in hf.parameters())
    assert spec.layers[1].tp_divisors == (4, 48)


def test_gpt_neo_built_on_the_meta_device_trains_like_one_process():
    """Its local layers' window mask is a non-persistent buffer: materialised as the model builds it."""
    x, y = token_data()
    assert_matches_reference(view(), make_plan(PLANS["pp2-tp2-zero3-ckpt"]), x, y, tol=1e-6, meta=True)
