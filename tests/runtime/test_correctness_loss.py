"""The step loss is the single-process loss of the whole global batch: targets equal to -100 are
ignored across ranks and micro-batches (the mean is over the global batch's valid tokens, not a mean
of per-rank means), on every strategy family; a user loss is a row mean weighted by rows."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, MODELS, same, token_data
from tests.runtime.reference import assert_matches_reference

pytestmark = pytest.mark.dist
E, L0, L1, H = GPT_UNITS


def masked_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """Token data whose rows have very different numbers of valid targets (row 1: none at all)."""
    x, y = token_data()
    y = y.clone()
    y[0, 2:] = -100
    y[1, :] = -100
    y[4, ::2] = -100
    y[6, 5:] = -100
    return x, y


PLANS = {
    "dp2": [(4, 2, [([0, 1], same(GPT_UNITS))])],
    "zero3": [(4, 2, [([0, 1], same(GPT_UNITS, zero=3))])],
    "pp2-1f1b": [(2, 4, [([0], same(GPT_UNITS[:2])), ([1], same(GPT_UNITS[2:]))])],
    "tp2-sp-loss-parallel": [(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])],
}


@pytest.mark.parametrize("name", list(PLANS))
def test_ignored_tokens_give_the_global_valid_token_mean(name):
    x, y = masked_tokens()
    assert_matches_reference(MODELS["gpt"][0], make_plan(PLANS[name]), x, y)


def test_ignored_tokens_gpipe_on_four_ranks_with_a_mix():
    """Two pipelines of different sizes (batch shares 6 / 2), TP + SP, ZeRO-1 and a GPipe schedule."""
    x, y = masked_tokens()
    plan = make_plan([(3, 2, [([0, 1], [(E, {"tp": 2}), (L0, {"tp": 2, "sp": True})]),
                              ([2], [(L1, {"zero": 0}), (H, {})])]),
                      (1, 2, [([3], same(GPT_UNITS))])], schedule="gpipe")
    assert_matches_reference(MODELS["gpt"][0], plan, x, y)


def classifier() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 13), nn.Tanh(), nn.Linear(13, 5))


def test_cross_entropy_loss_module_is_split_by_valid_rows():
    """``loss_fn=nn.CrossEntropyLoss(ignore_index=...)`` is split by valid targets too (class dim 1)."""
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 5, (8,), generator=g)
    y[[0, 1, 2, 5]] = 3
    loss = nn.CrossEntropyLoss(ignore_index=3, label_smoothing=0.1)
    plan = make_plan([(2, 4, [([0], same(["0", "1"])), ([1], same(["2"]))])])
    assert_matches_reference(classifier, plan, x, y, loss_fn=loss)


def _all_ignored(rank, world, plan, x, y):
    from autopar.errors import AutoparError
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(MODELS["gpt"][0](), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    try:
        pm.step(x, y)
    except AutoparError as e:
        return str(e)
    return "ran"


def test_a_batch_without_valid_tokens_is_nan_as_on_one_process():
    """0 valid tokens: single-process F.cross_entropy is 0/0 = nan; so is the step's loss (and it raises)."""
    from autopar.runtime.local_ranks import run_distributed
    from autopar.runtime.loss import cross_entropy

    x, y = token_data()
    y = torch.full_like(y, -100)
    torch.manual_seed(0)
    assert torch.isnan(cross_entropy(MODELS["gpt"][0]()(x), y))
    out = run_distributed(_all_ignored, 2, make_plan(PLANS["pp2-1f1b"]), x, y, timeout_s=30)
    assert all(o.startswith("step: non-finite loss (nan) at step 1") for o in out), out
