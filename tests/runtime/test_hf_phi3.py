"""transformers' Phi-3 through the runtime: its fused qkv_proj / gate_up_proj take HF's colwise_gather_output styles,
which autopar does not translate, so it runs with tp 1 (tp 2 refused in one line) and trains as one process does."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, HF_TINY, same, token_data
from tests.runtime.reference import assert_matches_reference, wrap_outcomes

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def phi3_model():
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(**HF_TINY, pad_token_id=0))


def hf_phi3():
    from autopar.models.hf import from_transformers

    return from_transformers(phi3_model())


@pytest.mark.parametrize("plan", [
    [(2, 4, [([0], same([E, L0], zero=1)), ([1], same([L1, H], ckpt="selective"))])],
    [(4, 2, [([0, 1], same(GPT_UNITS, zero=3, ckpt="full"))])],
], ids=["pp2", "zero3-ckpt"])
def test_phi3_trains_like_one_process(plan):
    x, y = token_data()
    assert_matches_reference(hf_phi3, make_plan(plan), x, y)


def test_phi3_tensor_parallel_is_refused_in_one_line():
    outcomes = wrap_outcomes(hf_phi3, make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2))])]))
    assert len(outcomes) == 2 and all("tp 2 is not legal for unit 'embed' (it has no TP plan)" in o for o in outcomes)


def test_the_units_view_equals_the_hf_model():
    from autopar.models.hf import from_transformers

    torch.manual_seed(0)
    hf = phi3_model().eval()
    x = token_data()[0]
    torch.testing.assert_close(from_transformers(hf)(x), hf(x).logits)
