"""Tuples and dicts of tensors cross pipeline stages and layout changes (packed into one tensor and
unpacked, gradients included) and train like the single-process model; what cannot cross (an integer
or None leaf, mixed dtypes, a tensor without the rows first) is refused on every rank at the first
step, naming the unit, instead of crashing one rank and hanging the others."""

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
    def __init__(self, kind: str = "tuple") -> None:
        super().__init__()
        self.lin, self.kind = nn.Linear(8, 8), kind

    def forward(self, x):
        a, b = self.lin(x), torch.tanh(x)
        if self.kind == "dict":
            return {"a": a, "b": b.unsqueeze(-1).expand(-1, -1, 2)}  # leaves of different shapes
        if self.kind == "ints":
            return a, (b > 0).long()
        if self.kind == "mixed":
            return a, b.double()
        if self.kind == "none":
            return a, None
        return a, b


class Join(nn.Module):
    def forward(self, pair):
        if isinstance(pair, dict):
            return pair["a"] * pair["b"].sum(-1)
        a, b = pair
        return a if b is None else a * b.to(a.dtype)


def model(kind: str):
    return lambda: nn.Sequential(nn.Linear(6, 8), Split(kind), Join(), nn.Linear(8, 3))


class Transposed(nn.Module):
    def forward(self, x):
        return x.t()


def transposed_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), Transposed(), Transposed(), nn.Linear(8, 3))


PIPE = [(2, 4, [([0], same(UNITS[:2])), ([1], same(UNITS[2:]))])]
ASYM = [(2, 3, [([0], same(UNITS[:2])), ([1], same(UNITS[2:]))]), (2, 1, [([2, 3], same(UNITS))])]


@pytest.mark.parametrize("kind", ["tuple", "dict"])
@pytest.mark.parametrize("plan", [
    PIPE, ASYM,
    [(4, 2, [([0, 1], same(UNITS[:2])), ([2], same(UNITS[2:], zero=1))])],  # dp 2 -> 1 across the stage
    [(4, 2, [([0, 1], [("0", {}), ("1", {"zero": 3}), ("2", {"tp": 1}), ("3", {})])]), ],  # no crossing
], ids=["pipeline", "asymmetric-4-ranks", "dp2-to-1-3-ranks", "one-stage"])
def test_tuples_and_dicts_cross_stages_exactly(kind, plan):
    x, y = float_data()
    assert_matches_reference(model(kind), make_plan(plan), x, y, loss_fn=mse)


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


@pytest.mark.parametrize("build,what", [(model("ints"), "a tuple of torch.float32, torch.int64"),
                                        (model("mixed"), "a tuple of torch.float32, torch.float64"),
                                        (model("none"), "a tuple of NoneType, torch.float32"),
                                        (transposed_model, "a tensor of shape (8, 2)")],
                         ids=["int-leaf", "mixed-dtypes", "none-leaf", "batch-not-first"])
@pytest.mark.parametrize("plan", [PIPE, ASYM], ids=["pipeline", "asymmetric-4-ranks"])
def test_what_cannot_cross_is_refused_on_every_rank(build, what, plan):
    start = time.monotonic()
    plan = make_plan(plan)
    out = run_distributed(_step, plan.world_size, build, plan, timeout_s=30)
    assert time.monotonic() - start < 10
    assert out == [f"model: unit 1 returns {what} for a micro-batch of 2 rows, but its output goes to 2 on other "
                   "ranks (pipeline stage or layout change), which takes tensors of one floating dtype (or one "
                   "tensor) with the micro-batch rows first; return such tensors from 1 (a tuple or dict of them "
                   "is fine), or keep 1 and 2 in one stage with the same tp"] * plan.world_size, out
