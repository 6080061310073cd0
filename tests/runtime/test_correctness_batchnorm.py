"""BatchNorm runs only where it is exact: its unit sees the whole global batch in one forward (one
pipeline, one micro-batch, no recomputation; data-parallel units share statistics over their DP group,
tests/runtime/test_resnet.py). There it trains like the
single-process model, running statistics included; anywhere else wrap refuses, on every rank,
naming the module and the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import float_data, mse, same
from tests.runtime.reference import assert_matches_reference

pytestmark = pytest.mark.dist
UNITS = ["0", "1", "2", "3"]


class NormAct(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.bn(x))


def bn_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), NormAct(), nn.Linear(8, 8), nn.Linear(8, 3))


EXACT = make_plan([(8, 1, [([0], same(UNITS[:2], zero=3)), ([1], same(UNITS[2:]))])])


def test_batchnorm_on_an_exact_plan_matches_single_process():
    x, y = float_data()
    assert_matches_reference(bn_model, EXACT, x, y, loss_fn=mse)


def test_batchnorm_on_four_stages_with_dp_elsewhere_is_exact():
    """Four ranks: the BatchNorm unit alone on one rank, the units around it data-parallel."""
    x, y = float_data()
    plan = make_plan([(8, 1, [([0, 1], same(UNITS[:1], zero=2)), ([2], same(UNITS[1:2])),
                              ([3], same(UNITS[2:]))])])
    assert_matches_reference(bn_model, plan, x, y, loss_fn=mse)


def _running_stats(rank, world, plan, x, y):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(bn_model(), plan, loss_fn=mse, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    for _ in range(3):
        pm.step(x, y)
    unit = pm.local_units.get("1")
    return None if unit is None else {k: v.detach().clone() for k, v in unit.named_buffers()}


def test_running_statistics_equal_the_single_process_ones():
    x, y = float_data()
    got = run_distributed(_running_stats, 2, EXACT, x, y, timeout_s=30)[0]
    torch.manual_seed(0)
    ref = bn_model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        mse(ref(x), y).backward()
        opt.step()
    want = dict(ref[1].named_buffers())
    assert set(got) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, atol=1e-6, rtol=1e-6)
    assert int(got["bn.num_batches_tracked"]) == 3


def _wrap_error(rank, world, plan):
    from autopar.errors import AutoparError
    from autopar.runtime import wrap

    torch.manual_seed(0)
    try:
        wrap(bn_model(), plan, loss_fn=mse, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    except AutoparError as e:
        return str(e)
    return "accepted"


@pytest.mark.parametrize("plan,where,why", [
    ([(4, 2, [([0], same(UNITS[:2])), ([1], same(UNITS[2:]))])], "pipelines[0].stages[0].layers[1]",
     "2 micro-batches"),
    ([(4, 1, [([0], same(UNITS))]), (4, 1, [([1], same(UNITS))])], "pipelines[0].stages[0].layers[1]",
     "2 pipelines share the batch"),
    ([(8, 1, [([0], same(UNITS[:2], ckpt="full")), ([1], same(UNITS[2:]))])], "pipelines[0].stages[0].layers[1]",
     "ckpt full runs its forward twice"),
], ids=["micro-batches", "two-pipelines", "full-ckpt"])
def test_inexact_batchnorm_is_refused_on_every_rank(plan, where, why):
    out = run_distributed(_wrap_error, 2, make_plan(plan), timeout_s=30)
    assert out == [f"{where}: unit 1 has BatchNorm 1.bn, whose statistics would be taken over part of the batch "
                   f"({why}), unlike single-process training; use GroupNorm or LayerNorm, or a plan with one "
                   "pipeline, one micro-batch and no full/op ckpt for that unit"] * 2, out
