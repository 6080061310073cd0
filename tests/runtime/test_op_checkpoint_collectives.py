"""Ckpt ``op`` under TP: which collectives backward reruns (what ``cost_models.layer.TP_BWD_FACTOR`` prices).

Counted on autopar's runtime (2 fork-started ranks, gloo): without SP the op policy reruns the same
collectives as full recomputation; with SP it reruns the all-gathers but no reduce-scatter (their
outputs are on torchtitan's save list).
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autopar.plan.compact import make_plan
from autopar.profile.reference import build_module
from autopar.runtime.local_ranks import run_distributed

pytestmark = pytest.mark.dist
UNITS = ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in COLLECTIVES:
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


def _backward_collectives(rank: int, world: int, sp: bool, ckpt: str) -> dict[str, int]:
    from autopar.runtime.wrap import wrap

    torch.manual_seed(0)
    strategies = [{}] + [{"tp": 2, "sp": sp, "ckpt": ckpt}] * 4 + [{}]
    pm = wrap(build_module("llama-tiny"), make_plan([(2, 1, [([0, 1], list(zip(UNITS, strategies)))])]),
              optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    y = pm.local_units["layers.0"](torch.randn(2, 32, 64, requires_grad=True))
    with _Count() as count:
        y.sum().backward()
    return dict(count.calls)


@pytest.mark.parametrize("sp", [False, True])
def test_op_reruns_what_the_cost_model_prices(sp):
    none, full, op = (run_distributed(_backward_collectives, 2, sp, c, timeout_s=120)[0] for c in ("none", "full", "op"))
    if not sp:
        assert op == full and op["all_reduce"] > none["all_reduce"]
    else:
        assert op["all_gather_into_tensor"] == full["all_gather_into_tensor"] > none["all_gather_into_tensor"]
        assert op["reduce_scatter_tensor"] == none["reduce_scatter_tensor"] < full["reduce_scatter_tensor"]
