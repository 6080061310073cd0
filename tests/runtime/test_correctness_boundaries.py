"""A tuple, dict or batch-less tensor that would cross ranks (a pipeline stage or a layout change)
is refused on every rank at the first step, naming the unit, instead of crashing one rank and
hanging the others; where it stays on its ranks it trains like the single-process model."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import float_data, mse, same
from tests.runtime.reference import assert_matches_reference

pytestmark = pytest.mark.dist
UNITS = ["0", "1", "2", "3"]


class Split(nn.Module):
    def __init__(self, as_dict: bool = False) -> None:
        super().__init__()
        self.lin, self.as_dict = nn.Linear(8, 8), as_dict

    def forward(self, x):
        a, b = self.lin(x), torch.tanh(x)
        return {"a": a, "b": b} if self.as_dict else (a, b)


class Join(nn.Module):
    def forward(self, pair):
        a, b = (pair["a"], pair["b"]) if isinstance(pair, dict) else pair
        return a * b


def tuple_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), Split(), Join(), nn.Linear(8, 3))


def dict_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), Split(as_dict=True), Join(), nn.Linear(8, 3))


class Transposed(nn.Module):
    def forward(self, x):
        return x.t()


def transposed_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), Transposed(), Transposed(), nn.Linear(8, 3))


def _step(rank, world, build, plan):
    from autopar.errors import AutoparError
    from autopar.runtime import wrap

    torch.manual_seed(0)
    x, y = float_data()
    pm = wrap(build(), plan, loss_fn=mse, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    try:
        pm.step(x, y)
    except AutoparError as e:
        return str(e)
    return "ran"


@pytest.mark.parametrize("build,what", [(tuple_model, "a tuple"), (dict_model, "a dict"),
                                        (transposed_model, "a tensor of shape (8, 2)")])
@pytest.mark.parametrize("plan", [
    [(2, 4, [([0], same(UNITS[:2])), ([1], same(UNITS[2:]))])],
    [(2, 3, [([0], same(UNITS[:2])), ([1], same(UNITS[2:]))]), (2, 1, [([2, 3], same(UNITS))])],
], ids=["pipeline", "asymmetric-4-ranks"])
def test_a_non_tensor_crossing_a_stage_is_refused_on_every_rank(build, what, plan):
    start = time.monotonic()
    plan = make_plan(plan)
    out = run_distributed(_step, plan.world_size, build, plan, timeout_s=30)
    assert time.monotonic() - start < 10
    assert out == [f"model: unit 1 returns {what} for a micro-batch of 2 rows, but its output goes to 2 on other "
                   "ranks (pipeline stage or layout change), which takes one tensor with the micro-batch rows "
                   "first; return one such tensor from 1, or keep 1 and 2 in one stage with the same tp"] * plan.world_size, out


@pytest.mark.parametrize("build", [tuple_model, dict_model])
def test_non_tensors_inside_a_stage_train_exactly(build):
    x, y = float_data()
    plan = make_plan([(2, 4, [([0], same(UNITS[:1])), ([1], same(UNITS[1:]))])])
    assert_matches_reference(build, plan, x, y, loss_fn=mse)
    plan = make_plan([(4, 2, [([0, 1], same(UNITS, zero=3))])])
    assert_matches_reference(build, plan, x, y, loss_fn=mse)
