"""The timeline is the estimate's numbers laid out in the runtime's schedule order: its step is the
estimate's, each stage's time per kind is what the estimate gives it, and one stage ends exactly at the step."""

from __future__ import annotations

import itertools

import pytest

from autopar.estimate import estimate_plan
from autopar.plan.schema import Pipeline, Plan
from autopar.show.timeline import build_timeline, kind_totals, schedule_order
from tests.cost_models.schedule_sim import schedule_order as oracle_order


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_schedule_order_is_the_textbook_order(schedule):
    """The runtime's table (which show reads) against the schedule simulator's independent order."""
    for p, m in itertools.product(range(1, 7), range(1, 10)):
        for s in range(p):
            assert schedule_order(schedule, p, s, m) == oracle_order(schedule, p, s, m), (p, s, m)


def test_step_is_the_estimates_and_rows_cover_it_without_overlap(drawn):
    tl = build_timeline(drawn.plan, drawn.model, drawn.est, drawn.params)
    assert tl.step_s == drawn.est.step_time_s
    assert len(tl.rows) == len(drawn.plan.stages)
    end = max(tl.step_s, tl.simulated_s)
    for row in tl.rows:
        segs = sorted(row.segments, key=lambda s: s[1])
        assert segs[0][1] == 0.0
        for a, b in zip(segs, segs[1:]):
            assert b[1] == pytest.approx(a[2], abs=1e-12), "gap or overlap"
        assert segs[-1][2] == pytest.approx(end, rel=1e-12)


def test_each_stage_spends_what_the_estimate_gives_it(drawn):
    tl = build_timeline(drawn.plan, drawn.model, drawn.est, drawn.params)
    o = drawn.params.slot_overhead_s
    stages = [(pipe, se) for pipe, ses in zip(drawn.plan.pipelines, drawn.est.pipelines) for se in ses]
    for row, (pipe, se) in zip(tl.rows, stages):
        t = kind_totals(row)
        m = pipe.num_microbatches
        assert row.devices == se.devices
        assert t["forward"] == pytest.approx(m * (se.fwd_s + o / 2), rel=1e-9)
        assert t["backward"] + t["recompute"] == pytest.approx(m * (se.bwd_s + o / 2), rel=1e-9)
        if len(drawn.plan.pipelines) == 1:
            assert t["grad sync"] == pytest.approx(se.step_s, rel=1e-9)


def test_recompute_shows_where_layers_checkpoint(homogeneous):
    ckpt = [any(ly.strategy.ckpt != "none" for ly in st.layers) for st in homogeneous.plan.stages]
    assert any(ckpt), "the fixture should checkpoint somewhere"
    tl = build_timeline(homogeneous.plan, homogeneous.model, homogeneous.est, homogeneous.params)
    for row, has in zip(tl.rows, ckpt):
        assert (kind_totals(row)["recompute"] > 0) == has


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_one_stage_ends_exactly_at_the_estimates_step(homogeneous, schedule):
    """One stage: the closed form is exact, so the simulated schedule ends at the step (to rounding)."""
    d = homogeneous
    st0 = d.plan.pipelines[0]
    whole = [st0.stages[0].devices + st0.stages[1].devices]
    stage = type(st0.stages[0])(whole[0], st0.stages[0].layers + st0.stages[1].layers)
    plan = Plan(d.plan.model, d.plan.cluster, d.plan.global_batch_size,
                [Pipeline(st0.batch_share, st0.micro_batch_size, st0.num_microbatches, [stage])], schedule=schedule)
    est = estimate_plan(plan, d.model, d.params)
    tl = build_timeline(plan, d.model, est, d.params)
    assert tl.simulated_s == pytest.approx(est.step_time_s, rel=1e-9)
    assert tl.step_s == est.step_time_s
