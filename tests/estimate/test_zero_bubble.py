"""A zb-h1 pipeline's estimate: the step simulated over the runtime's table with B and W split, the
activations of every micro-batch held until its W."""

from __future__ import annotations

import pytest

from autopar.cluster import load_cluster
from autopar.estimate import estimate_plan
from autopar.estimate.context import StageContext
from autopar.estimate.zero_bubble import zero_bubble_inflight
from autopar.modelspec.load import load_model
from autopar.plan.schema import Plan, Strategy
from cost_models import CostParams
from cost_models.pipeline import stage_work
from cost_models.pipeline_schedules import schedule_table, simulate_schedule
from cost_models.zero_bubble import weight_grad_time
from tests.estimate.even_plan import even_pipeline_plan

MODEL = load_model("llama2-7b", 4096)  # 34 units: embed, 32 blocks, head
CLUSTER = load_cluster("2x8xA100-80G")


def _plan(p: int, m: int, schedule: str, gbs: int = 64) -> Plan:
    """``p`` stages of 16 / p devices (tp 2, zero 1), the units cut into p near-equal runs."""
    return even_pipeline_plan(MODEL, CLUSTER, p, m, Strategy(tp=2, zero=1), schedule, gbs)


def test_the_step_is_the_table_simulated_with_b_and_w_split():
    plan = _plan(4, 8, "zb-h1")
    est = estimate_plan(plan, MODEL)
    stages = est.pipelines[0]
    index = MODEL.index()
    wgt = []
    for st in plan.pipelines[0].stages:
        ctx = StageContext(CLUSTER, tuple(st.devices), 8, 8, CostParams())
        wgt.append(sum(weight_grad_time(MODEL.layers[index[ly.name]], ly.strategy, ctx) for ly in st.layers))
    assert all(0 < w < se.bwd_s for w, se in zip(wgt, stages))
    fwd = [se.fwd_s for se in stages]
    # B: the rest of the stage's work (slot overhead 0); the step tail once, after the stage's last slot
    bwd = [stage_work(se.cost_per_microbatch_s, se.step_s, 8) - se.fwd_s - w for se, w in zip(stages, wgt)]
    want = simulate_schedule(schedule_table("zb-h1", 4, 8), fwd, bwd, [se.p2p_s for se in stages],
                             tails=[se.step_s for se in stages], wgt_s=wgt).step_s
    assert est.step_time_s == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 16), (8, 8)])
def test_zb_h1_shrinks_the_bubble_and_later_stages_hold_stage_0s_activations(p, m):
    """Against 1F1B on the very same stages: faster (W fills the drain), stage 0's memory unchanged, stage s
    holding min(p, m) micro-batches instead of min(p - s, m), so more memory on every later stage."""
    one, zb = estimate_plan(_plan(p, m, "1f1b"), MODEL), estimate_plan(_plan(p, m, "zb-h1"), MODEL)
    assert zb.step_time_s < one.step_time_s
    assert zero_bubble_inflight(p, m) == [min(p, m)] * p
    assert [s.inflight for s in zb.pipelines[0]] == [min(p, m)] * p
    assert zb.pipelines[0][0].memory_gib == pytest.approx(one.pipelines[0][0].memory_gib)
    for a, b in zip(one.pipelines[0][1:], zb.pipelines[0][1:]):
        assert b.memory_gib > a.memory_gib
