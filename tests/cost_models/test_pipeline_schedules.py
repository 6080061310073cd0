"""The schedule tables and what the cost model reads off them, against the published formulas."""

from __future__ import annotations

import pytest

from cost_models.memory import inflight_microbatches
from cost_models.pipeline import pipeline_time
from cost_models.pipeline_schedules import (
    inflight_profile,
    schedule_problem,
    schedule_table,
    simulate_schedule,
)


def simulate_step(*args, **kwargs) -> float:
    """The simulated step time (``simulate_schedule(...).step_s``)."""
    return simulate_schedule(*args, **kwargs).step_s


def _flat(slots):
    return [a for slot in slots for a in slot]


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 2, 8), (2, 4, 4), (3, 2, 6), (4, 2, 4), (4, 2, 8), (4, 3, 12),
                                   (8, 2, 16), (8, 4, 8)])
def test_interleaved_bubble_is_megatrons(p, v, m):
    """Equal chunks (a stage's forward 1, backward 2, split over v chunks), no p2p: the step is the ideal
    m * 3 plus Megatron's bubble (p - 1) / (v m) of it (Narayanan et al. 2021, section 2.2.2)."""
    table = schedule_table("interleaved", p, m, v)
    t = simulate_step(table, [1 / v] * (p * v), [2 / v] * (p * v), [0.0] * (p * v))
    assert t == pytest.approx(3 * m * (1 + (p - 1) / (v * m)), rel=1e-12)


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 16), (8, 4, 32), (3, 2, 9)])
def test_interleaved_first_stage_holds_megatrons_activations(p, v, m):
    """Stage 0 peaks at p (1 + (p - 1) / (p v)) stages' worth of micro-batch activations (Korthikanti et al.
    2022, section 4.2.3) once m >= 2p (a chunk holds 1 / v of a stage's); later stages hold fewer."""
    table = schedule_table("interleaved", p, m, v)
    peaks = [max(sum(live) for live in inflight_profile(_flat(slots), v)) for slots in table]
    assert peaks[0] / v == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert peaks == sorted(peaks, reverse=True), "earlier stages hold more"


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", [(1, 1), (1, 4), (2, 1), (2, 3), (4, 3), (4, 8), (5, 8)])
def test_plain_tables_give_the_estimates_in_flight_counts_and_step(schedule, p, m):
    """1F1B and GPipe: the table's peak in flight is ``inflight_microbatches`` (what the estimate uses), and
    its simulated step with equal stages and no p2p is ``pipeline_time``'s formula."""
    table = schedule_table(schedule, p, m)
    for s, slots in enumerate(table):
        assert max(sum(live) for live in inflight_profile(_flat(slots))) == inflight_microbatches(schedule, p, s, m)
    assert simulate_step(table, [1.0] * p, [2.0] * p, [0.0] * p) == pytest.approx(pipeline_time([3.0] * p, [0.0] * p, m))


def test_gpipe_step_with_p2p_is_the_formula():
    """GPipe's critical path crosses every boundary once each way: exactly the formula's P_i."""
    t = simulate_step(schedule_table("gpipe", 4, 6), [1.0] * 4, [2.0] * 4, [0.25, 0.25, 0.25, 0.0])
    assert t == pytest.approx(pipeline_time([3.0] * 4, [0.5, 0.5, 0.5, 0.0], 6))


def test_interleaved_pays_more_p2p_than_1f1b():
    """Every chunk boundary is crossed: with costly p2p the interleaved table loses its bubble gain."""
    p, m = 4, 8
    free = simulate_step(schedule_table("interleaved", p, m, 2), [0.5] * 8, [1.0] * 8, [0.0] * 8)
    slow = simulate_step(schedule_table("interleaved", p, m, 2), [0.5] * 8, [1.0] * 8, [1.0] * 8)
    plain = simulate_step(schedule_table("1f1b", p, m), [1.0] * 4, [2.0] * 4, [0.0] * 4)
    assert free < plain < slow


def test_uneven_chunks_follow_the_slowest_stage():
    """One stage twice as slow: the step is at least m times its work, and above the equal-chunk step."""
    p, v, m = 2, 2, 4
    fwd = [1.0, 2.0, 1.0, 2.0]  # stage 1 (chunks 1 and 3) twice as slow
    t = simulate_step(schedule_table("interleaved", p, m, v), fwd, [2 * f for f in fwd], [0.0] * 4)
    assert t >= m * v * 6.0
    assert t > simulate_step(schedule_table("interleaved", p, m, v), [1.0] * 4, [2.0] * 4, [0.0] * 4)


@pytest.mark.parametrize("schedule,p,m,v,phrase", [
    ("interleaved", 2, 4, 1, "virtual_stages >= 2"), ("interleaved", 1, 4, 2, "at least 2 pipeline stages"),
    ("interleaved", 4, 6, 2, "multiple of the stage count"), ("1f1b", 2, 4, 2, "needs the interleaved schedule"),
    ("zb-h1", 2, 4, 1, "unknown schedule")])
def test_sizes_without_a_table(schedule, p, m, v, phrase):
    assert phrase in schedule_problem(schedule, p, m, v)
    with pytest.raises(ValueError, match=phrase):
        schedule_table(schedule, p, m, v)
    assert schedule_problem("interleaved", 4, 8, 2) is None


def test_a_crossed_table_deadlocks_the_simulation():
    table = schedule_table("gpipe", 2, 2)
    table[0] = [[("F", 0, 0)], [("F", 1, 0)], [("B", 1, 0)], [("B", 0, 0)]]
    table[1] = [[("F", 0, 0)], [("F", 1, 0)], [("B", 0, 0)], [("B", 1, 0)]]
    assert simulate_step(table, [1.0] * 2, [1.0] * 2, [0.0] * 2) > 0  # out of order but not blocked
    table[1] = [[("F", 1, 0)], [("F", 0, 0)], [("B", 0, 0)], [("B", 1, 0)]]
    table[0] = [[("F", 0, 0)], [("B", 0, 0)], [("F", 1, 0)], [("B", 1, 0)]]
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate_step(table, [1.0] * 2, [1.0] * 2, [0.0] * 2)
