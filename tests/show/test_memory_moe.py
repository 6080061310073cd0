"""The memory bars of an expert-parallel plan add up to its estimated peak (experts split 1/ep, ZeRO over dp/ep)."""

from __future__ import annotations

import pytest

from autopar.cluster import load_cluster
from autopar.estimate import estimate_plan
from autopar.estimate.plan_cost import plan_cost_params
from autopar.modelspec import from_zoo
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from autopar.show.memory import stage_memory


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_ep_plan_bars_sum_to_the_estimate(zero):
    m = from_zoo("mixtral-8x7b", seq_len=1024)
    layers = [StageLayer(ly.name, Strategy(zero=zero, ckpt="full" if ly.moe else "none", ep=4 if ly.moe else 1))
              for ly in m.layers]
    plan = Plan(ModelRef(m.name, m.seq_len, m.num_layers, m.source), load_cluster("2x8xH100"), 32,
                [Pipeline(32, 16, 2, [Stage(list(range(16)), layers)])])
    est = estimate_plan(plan, m)
    (bars,) = stage_memory(plan, m, est, plan_cost_params(plan))
    assert bars.summed_gib == pytest.approx(bars.total_gib, rel=1e-9)
    assert bars.total_gib == pytest.approx(est.max_memory_gib, rel=1e-9)
