"""A 1F1B / GPipe pipeline's estimate is its schedule table simulated: on a geo-distributed cluster every
micro-batch's send sits on the 1F1B chain, which the closed form charged once each way."""

from __future__ import annotations

import pytest

from autopar.cluster import load_cluster
from autopar.estimate import estimate_plan
from autopar.modelspec.load import load_model
from autopar.plan.schema import Plan, Strategy
from cost_models.pipeline import pipeline_time
from cost_models.pipeline_schedules import schedule_table, simulate_schedule
from tests.estimate.even_plan import even_pipeline_plan

MODEL = load_model("gpt3-1.3b", 2048)
GEO = load_cluster("geo-us-3region")  # 48 devices in three zones, slow links between zones


def _plan(schedule: str, p: int = 6, m: int = 16, gbs: int = 128) -> Plan:
    """``p`` stages of 48 / p devices in device order (so stages cross zones), dp only, near-equal units."""
    return even_pipeline_plan(MODEL, GEO, p, m, Strategy(tp=1, zero=1), schedule, gbs)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_the_step_is_the_runtime_table_simulated_with_the_stages_figures(schedule):
    est = estimate_plan(_plan(schedule), MODEL)
    st, m = est.pipelines[0], 16
    assert est.step_time_s == est.pipeline_times_s[0]
    fwd = [s.fwd_s for s in st]  # no slot overhead by default
    bwd = [s.cost_per_microbatch_s - s.step_s / m - s.fwd_s for s in st]
    sim = simulate_schedule(schedule_table(schedule, len(st), m), fwd, bwd, [s.p2p_s for s in st],
                            tails=[s.step_s for s in st])
    assert est.step_time_s == pytest.approx(sim.step_s, rel=1e-12)
    assert max(s.p2p_s for s in st) > max(s.fwd_s for s in st)  # the slow links: sends outlast the work


def test_on_slow_links_every_micro_batch_pays_its_sends():
    """The closed form (each boundary crossed once each way) is far below the 1F1B schedule there."""
    est = estimate_plan(_plan("1f1b"), MODEL)
    st, m = est.pipelines[0], 16
    closed = pipeline_time([s.cost_per_microbatch_s for s in st], [2 * s.p2p_s for s in st], m,
                           steps=[s.step_s for s in st])
    assert est.step_time_s > 1.5 * closed
    worst = max(s.p2p_s for s in st)
    assert est.step_time_s > m * worst  # the slowest link carries every micro-batch, one at a time
