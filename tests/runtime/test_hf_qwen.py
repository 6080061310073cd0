"""transformers' Qwen2 (Llama with biased Q/K/V projections) and Qwen3 (per-head Q/K norms, heads head_dim wide)
through the runtime: Qwen2's biases shard with their columns under TP and sequence parallelism, Qwen3's Q/K
norms stay whole with their gradients summed over TP; every strategy trains as one process does, and the
tracer and the config formulas give the same units."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, HF_TINY, same, token_data
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def qwen2_model():
    cfg = transformers.Qwen2Config(**HF_TINY, tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # HF starts the biases at zero: random ones show a wrongly sharded bias
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model


def hf_qwen2():
    from autopar.models.hf import from_transformers

    return from_transformers(qwen2_model())


def test_the_units_view_equals_the_hf_model_and_keeps_the_biases():
    from autopar.models.hf import from_transformers

    torch.manual_seed(0)
    hf = qwen2_model().eval()
    x = token_data()[0]
    view = from_transformers(hf)
    torch.testing.assert_close(view(x), hf(x).logits)
    biased = sorted(n for n, _ in view.named_parameters() if n.endswith("bias"))
    assert biased == [f"layers.{i}.layer.self_attn.{p}_proj.bias" for i in (0, 1) for p in "kqv"]


def test_the_qwen3_units_view_equals_the_hf_model():
    from autopar.models.hf import from_transformers

    torch.manual_seed(0)
    hf = qwen3_model().eval()
    x = token_data()[0]
    torch.testing.assert_close(from_transformers(hf)(x), hf(x).logits)


@pytest.mark.parametrize("plan", [
    [(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])],
    [(4, 2, [([0, 1], same(GPT_UNITS, tp=2))])],
    [(2, 4, [([0, 1], same([E, L0], tp=2, zero=3)), ([2, 3], same([L1, H], tp=2, sp=True, ckpt="full"))])],
    [(2, 4, [([0], same([E, L0], zero=1)), ([1], same([L1, H], ckpt="selective"))])],
], ids=["tp2-sp", "tp2", "pp2-tp2-zero3-ckpt", "pp2-dp"])
def test_qwen2_trains_like_one_process(plan):
    x, y = token_data()
    assert_matches_reference(hf_qwen2, make_plan(plan), x, y)


def test_the_traced_qwen2_equals_its_config():
    """The tracer (what `autopar search --model pkg:factory` reads) and the config formulas agree on every unit."""
    import json
    import tempfile

    from autopar.models.hf import from_transformers
    from autopar.modelspec.load import load_model
    from autopar.modelspec.trace import spec_from_module

    traced = spec_from_module(from_transformers(qwen2_model()), token_data(batch=1, seq=16)[0], dtype_bytes=2)
    cfg = {"model_type": "qwen2", **qwen2_model().config.to_diff_dict()}
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/config.json"
        with open(path, "w") as f:
            json.dump(cfg, f)
        config = load_model(path, seq_len=16)
    for t, c in zip(traced.layers, config.layers, strict=True):
        assert (t.name, t.params, t.tp_params) == (c.name, c.params, c.tp_params)
        assert t.flops == pytest.approx(c.flops, rel=1e-9)


def qwen3_model():
    """head_dim 16 with hidden 32 and 4 heads: queries 64 wide, wider than the hidden state (as Qwen3-0.6B's)."""
    cfg = transformers.Qwen3Config(**HF_TINY, head_dim=16, tie_word_embeddings=False)
    model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # HF starts the norms at one: random weights show a norm applied to the wrong heads
        for name, p in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.normal_(1.0, 0.5)
    return model


def hf_qwen3():
    from autopar.models.hf import from_transformers

    return from_transformers(qwen3_model())


@pytest.mark.parametrize("plan", [
    [(2, 4, [([0], same([E, L0], zero=1)), ([1], same([L1, H], ckpt="selective"))])],
    [(4, 2, [([0, 1], same(GPT_UNITS, zero=3, ckpt="full"))])],
    [(4, 2, [([0, 1], same(GPT_UNITS, tp=2))])],
    [(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])],
    [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, zero=3))])],
    [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, zero=1, ckpt="full"))])],
    [(2, 4, [([0, 1], same([E, L0], tp=2)), ([2, 3], same([L1, H], tp=2, sp=True))])],
    [(2, 2, [([0, 1], same(GPT_UNITS, tp=2))]), (4, 1, [([2], same(GPT_UNITS))])],
], ids=["pp2", "zero3-ckpt", "tp2", "tp2-sp", "tp2-dp2-zero3", "tp2-dp2-zero1-ckpt", "pp2-tp2", "two-pipelines"])
def test_qwen3_trains_like_one_process(plan):
    """Under TP each rank normalises its own heads with the whole Q/K norm weights: their gradients are summed
    over TP (tp_grad_sum), else the norms would drift from the one-process run."""
    x, y = token_data()
    assert_matches_reference(hf_qwen3, make_plan(plan), x, y)


def test_the_traced_qwen3_equals_its_config(tmp_path):
    import json

    from autopar.models.hf import from_transformers
    from autopar.modelspec.load import load_model
    from autopar.modelspec.trace import spec_from_module

    traced = spec_from_module(from_transformers(qwen3_model()), token_data(batch=1, seq=16)[0], dtype_bytes=2)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", **qwen3_model().config.to_diff_dict()}))
    config = load_model(str(tmp_path / "config.json"), seq_len=16)
    for t, c in zip(traced.layers, config.layers, strict=True):
        assert (t.name, t.params) == (c.name, c.params)
        assert t.flops == pytest.approx(c.flops, rel=1e-9)


@pytest.mark.parametrize("plan", [
    [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, zero=1))])],
    [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])],
], ids=["tp2-zero1", "tp2-sp-zero3"])
def test_qwen3_clipped_under_tp_like_one_process(plan):
    """The global gradient norm counts each summed Q/K norm gradient once, as clip_grad_norm_ does."""
    from tests.runtime.api_reference import assert_script_matches
    from tests.runtime.cases import MODELS

    MODELS.setdefault("hf-qwen3", (hf_qwen3, GPT_UNITS, token_data(), None))  # forked ranks inherit it
    figures = assert_script_matches("hf-qwen3", make_plan(plan), [(0, False), (1, False)], max_grad_norm=0.3)
    assert all(n > 0.3 for n in figures["ref_norms"]), figures  # clipping was active
