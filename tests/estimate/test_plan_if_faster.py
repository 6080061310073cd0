"""``estimate_plan_if_faster``: the baselines' shortcut. ``step_lower_bound`` never exceeds the simulated
step, and the shortcut returns ``estimate_plan``'s very figures or None only for a plan that does not fit
or cannot be strictly faster."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.estimate import CostCache, StageEstimate, estimate_plan
from autopar.estimate.pipeline import pipeline_time, step_lower_bound
from autopar.estimate.plan_cost import estimate_plan_if_faster
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from cost_models import CostParams
from tests.search.tiny import gpt_like, small_cluster


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("seed", range(20))
def test_the_bound_is_below_the_simulated_step(schedule, seed):
    rng = np.random.default_rng(seed)
    p, m = int(rng.integers(1, 7)), int(rng.integers(1, 13))
    params = CostParams(slot_overhead_s=float(rng.choice([0.0, 1e-3])))
    stages = []
    for _ in range(p):
        fwd, bwd, step = rng.uniform(0.1, 1.0), rng.uniform(0.1, 2.0), float(rng.choice([0.0, rng.uniform(0, 3)]))
        stages.append(StageEstimate([0], ["x"], fwd + bwd + step / m, fwd, bwd, step, 1, 0.0,
                                    p2p_s=float(rng.choice([0.0, rng.uniform(0, 0.5)]))))
    bound = step_lower_bound(stages, m, params)
    assert 0 < bound <= pipeline_time(stages, m, params, schedule) * (1 + 1e-12)
    if p == 1:  # one stage: nothing waits, the bound is the step (to rounding)
        assert bound == pytest.approx(pipeline_time(stages, m, params, schedule), rel=1e-12)


def _plan(schedule: str = "1f1b", budget: float | None = None, pipelines: int = 1) -> tuple:
    model, cluster = gpt_like(blocks=2), small_cluster(2, 2)
    names = [ly.name for ly in model.layers]
    s = Strategy(1, 1, "none")
    if pipelines == 1:
        pipes = [Pipeline(8, 2, 4, [Stage([0, 1], [StageLayer(n, s) for n in names[:2]]),
                                    Stage([2, 3], [StageLayer(n, s) for n in names[2:]])])]
    else:
        pipes = [Pipeline(4, 2, 2, [Stage([0, 1], [StageLayer(n, s) for n in names])]),
                 Pipeline(4, 2, 2, [Stage([2, 3], [StageLayer(n, s) for n in names])])]
    plan = Plan(ModelRef(model.name, model.seq_len, model.num_layers), cluster, 8, pipes, schedule=schedule,
                memory_budget_gib=budget)
    return plan, model


PARAMS = CostParams(reserve_gib=0.0)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_a_plan_that_may_be_faster_gets_estimate_plans_figures(schedule):
    plan, model = _plan(schedule)
    want = estimate_plan(plan, model, PARAMS)
    got = estimate_plan_if_faster(plan, model, PARAMS, CostCache(), float("inf"))
    assert want.fits and got is not None
    assert got.step_time_s == want.step_time_s and got.mfu == want.mfu and got.tokens_per_s == want.tokens_per_s
    assert got.pipeline_times_s == want.pipeline_times_s and got.stage_budget_gib == want.stage_budget_gib
    assert [[st.memory_bytes for st in p] for p in got.pipelines] == [[st.memory_bytes for st in p]
                                                                       for p in want.pipelines]
    slower = estimate_plan_if_faster(plan, model, PARAMS, CostCache(), want.step_time_s * 1.0001)
    assert slower is not None and slower.step_time_s == want.step_time_s


def test_a_plan_that_cannot_be_faster_or_does_not_fit_is_none():
    plan, model = _plan()
    want = estimate_plan(plan, model, PARAMS)
    assert estimate_plan_if_faster(plan, model, PARAMS, CostCache(), want.step_time_s * 0.5) is None
    tight, _ = _plan(budget=1e-4)
    assert not estimate_plan(tight, model, PARAMS).fits
    assert estimate_plan_if_faster(tight, model, PARAMS, CostCache(), float("inf")) is None


def test_two_pipelines_are_estimated_in_full():
    plan, model = _plan(pipelines=2)
    want = estimate_plan(plan, model, PARAMS)
    got = estimate_plan_if_faster(plan, model, PARAMS, CostCache(), float("inf"))
    assert got is not None and got.step_time_s == want.step_time_s
