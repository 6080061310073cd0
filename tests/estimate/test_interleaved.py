"""An interleaved pipeline's estimate: the step simulated over the runtime's table, memory per physical stage."""

from __future__ import annotations

import pytest

from autopar.cluster import load_cluster
from autopar.estimate import estimate_plan
from autopar.estimate.cache import CostCache
from autopar.estimate.interleaved import estimate_interleaved
from autopar.modelspec.load import load_model
from autopar.plan.schema import Plan, Strategy
from cost_models import CostParams
from cost_models.pipeline_schedules import schedule_table, simulate_schedule
from tests.estimate.even_plan import even_pipeline_plan

MODEL = load_model("llama2-7b", 4096)  # 34 units: embed, 32 blocks, head
CLUSTER = load_cluster("2x8xA100-80G")


def simulate_step(*args, **kwargs) -> float:
    """The simulated step time (``simulate_schedule(...).step_s``)."""
    return simulate_schedule(*args, **kwargs).step_s


def _plan(p: int, v: int, m: int, gbs: int = 64) -> Plan:
    """``p`` stages of 16 / p devices (tp 2, zero 1), the units cut into p * v near-equal chunks."""
    return even_pipeline_plan(MODEL, CLUSTER, p, m, Strategy(tp=2, zero=1), "interleaved" if v > 1 else "1f1b", gbs, v)


def test_the_step_is_the_table_simulated_with_the_chunks_own_times():
    plan = _plan(4, 2, 8)
    est = estimate_plan(plan, MODEL)
    chunks = est.pipelines[0]
    assert len(chunks) == 8 and [c.layers for c in chunks] == [st.layer_names for st in plan.pipelines[0].stages]
    fwd = [c.fwd_s for c in chunks]
    bwd = [c.cost_per_microbatch_s - c.step_s / 8 - c.fwd_s for c in chunks]  # backward, switches (no slot cost)
    tails = [sum(c.step_s for c in chunks[s::4]) for s in range(4)]  # each stage's chunks' tails, once per step
    assert min(tails) > 0
    want = simulate_step(schedule_table("interleaved", 4, 8, 2), fwd, bwd, [c.p2p_s for c in chunks], tails=tails)
    assert est.step_time_s == pytest.approx(want, rel=1e-12)
    assert chunks[3].p2p_s > 0 and chunks[-1].p2p_s == 0  # chunk 3 (stage 3) -> chunk 4 (stage 0) is a boundary


def test_devices_are_counted_once_and_chunks_of_a_stage_share_its_memory():
    est = estimate_plan(_plan(4, 2, 8), MODEL)
    chunks = est.pipelines[0]
    assert sorted(est.memory_gib) == list(range(16))
    assert est.tps * 16 == pytest.approx(est.tokens_per_s)
    for s in range(4):
        assert chunks[s].memory_gib == chunks[s + 4].memory_gib
    assert est.predicted()["memory_gib"]["per_stage"][0][0] == round(chunks[0].memory_gib, 3)


def test_interleaving_shrinks_the_bubble_and_costs_first_stage_memory():
    """Few micro-batches on 4 stages: v = 2 beats 1F1B (bubble (p - 1) / (v m) instead of (p - 1) / m, the
    extra p2p inside a node is small); with m >= 2p stage 0 holds more activations (p (1 + (p - 1) / (p v))
    stages' worth instead of p); with m = p both hold every micro-batch."""
    plain, inter = estimate_plan(_plan(4, 1, 4), MODEL), estimate_plan(_plan(4, 2, 4), MODEL)
    assert inter.step_time_s < plain.step_time_s
    assert inter.pipelines[0][0].memory_gib == pytest.approx(plain.pipelines[0][0].memory_gib)
    plain, inter = estimate_plan(_plan(4, 1, 8), MODEL), estimate_plan(_plan(4, 2, 8), MODEL)
    assert inter.step_time_s < plain.step_time_s
    assert inter.pipelines[0][0].memory_gib > plain.pipelines[0][0].memory_gib


def test_more_in_flight_memory_with_more_micro_batches_until_the_table_saturates():
    """m = p holds fewer micro-batches than m = 2p; beyond that the peak stays (the table's warm-up is fixed)."""
    mem = [estimate_interleaved(_plan(4, 2, m).pipelines[0], MODEL, CLUSTER, CostParams(), CostCache())[0][0]
           .memory_bytes for m in (4, 8, 16)]
    per_sample = [x / (64 // m) for x, m in zip(mem, (4, 8, 16))]
    assert mem[0] > mem[1] > mem[2]  # smaller micro-batches
    assert per_sample[0] < per_sample[1]
