"""ZeRO-2 holds only gradient slices across micro-batches: each unit's full gradient is
reduce-scattered and freed as soon as its backward has produced it."""

import pytest
import torch

import autopar
from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import MLP_UNITS, float_data, mlp, mse, same


def _probe(rank: int, world: int, plan):
    torch.manual_seed(0)
    pm = autopar.wrap(mlp(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), loss_fn=mse)
    inputs, targets = float_data()
    pm.runner.run(inputs, targets)  # the schedule alone: every micro-batch's forward and backward
    held = {}
    for st in pm._states:
        full = [p.grad for p in st.unit.module.parameters() if p.grad is not None]
        sliced = st.shard.master.grad if st.shard is not None else None
        held[st.unit.name] = (len(full), None if sliced is None else sliced.numel())
    return held


@pytest.mark.dist
def test_zero2_keeps_no_full_gradient_between_micro_batches():
    plan = make_plan([(4, 2, [([0, 1], same(MLP_UNITS, zero=2))])])
    held = run_distributed(_probe, 2, plan)
    for rank_held in held:
        for unit, (full, sliced) in rank_held.items():
            if sliced is None:
                continue  # a unit without parameters (activation)
            assert full == 0, unit
            assert sliced > 0


@pytest.mark.dist
def test_zero1_keeps_full_gradients_until_the_step():
    plan = make_plan([(4, 2, [([0, 1], same(MLP_UNITS, zero=1))])])
    held = run_distributed(_probe, 2, plan)
    assert any(full > 0 for rank_held in held for full, _ in rank_held.values())
