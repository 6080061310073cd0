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
    ("zb-v", 2, 4, 1, "unknown schedule"), ("zb-h1", 1, 4, 1, "at least 2 pipeline stages"),
    ("zb-h1", 2, 4, 2, "needs the interleaved schedule")])
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


@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (3, 3), (4, 4), (4, 8), (4, 16), (8, 8), (8, 24)])
def test_zb_h1_bubble_is_the_papers(p, m):
    """F = B = W = 1 (1F1B's backward 2), no p2p, m >= p: ZB-H1's step is m (F + B + W) plus the bubble
    (p - 1)(F + B - W) = p - 1 (Qi et al. 2024, section 3.1), a third of 1F1B's (p - 1)(F + B + W)."""
    zb = simulate_step(schedule_table("zb-h1", p, m), [1.0] * p, [1.0] * p, [0.0] * p, wgt_s=[1.0] * p)
    one = simulate_step(schedule_table("1f1b", p, m), [1.0] * p, [2.0] * p, [0.0] * p)
    assert zb == 3 * m + (p - 1)
    assert one == 3 * m + 3 * (p - 1)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 2), (4, 3), (4, 8), (5, 9)])
def test_zb_h1_table_splits_1f1b_and_holds_its_stage_0_peak_everywhere(p, m):
    """Every stage runs 1F1B's F and B order, each micro-batch's W after its B (and in order); with the
    activations held until W, every stage peaks at min(p, m) in flight, 1F1B's stage-0 peak."""
    for s, slots in enumerate(schedule_table("zb-h1", p, m)):
        acts = _flat(slots)
        assert all(len(slot) == 1 for slot in slots)
        assert [a for a in acts if a[0] != "W"] == _flat(schedule_table("1f1b", p, m)[s])
        ws = [a for a in acts if a[0] == "W"]
        assert ws == [("W", k, 0) for k in range(m)]
        assert all(acts.index(("B", k, 0)) < acts.index(("W", k, 0)) for k in range(m))
        assert max(live[0] for live in inflight_profile(acts)) == min(p, m) == inflight_microbatches("zb-h1", p, s, m)
        assert max(live[0] for live in inflight_profile([a for a in acts if a[0] != "W"])) == min(p - s, m)


def test_zb_h1_with_free_w_is_1f1b_with_the_shorter_backward():
    p, m = 4, 8
    free = simulate_step(schedule_table("zb-h1", p, m), [1.0] * p, [1.0] * p, [0.0] * p, wgt_s=[0.0] * p)
    assert free == simulate_step(schedule_table("1f1b", p, m), [1.0] * p, [1.0] * p, [0.0] * p)


@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (3, 3), (4, 4), (4, 8), (4, 12), (8, 16)])
def test_zb_h1_table_is_torchs_zero_bubble_order_for_one_stage_per_rank(p, m):
    """torch.distributed.pipelining builds ScheduleInterleavedZeroBubble's per-rank order with
    ``_get_1f1b_rank_ops(enable_zero_bubble=True)``; with one stage per rank (its warm-up then p - 1 - rank
    forwards, ``num_1f1b_microbatches = rank``) that order, less its idle slots, is this table's."""
    from torch.distributed.pipelining import schedules as ts

    kinds = {ts._ComputationType.FORWARD: "F", ts._ComputationType.BACKWARD_INPUT: "B",
             ts._ComputationType.BACKWARD_WEIGHT: "W"}
    for rank in range(p):
        warm = ts._get_warmup_ops(rank, 1, p, p, m, multiply_factor=1)  # one local stage: min(p - 1 - rank, m)
        ops = ts._get_1f1b_rank_ops(1, p, warm, m - warm, warm, rank, lambda _, r=rank: r, lambda _, r=rank: r, rank,
                                    enable_zero_bubble=True)
        theirs = [(kinds[a.computation_type], a.microbatch_index, 0) for a in ops if a is not None]
        assert theirs == _flat(schedule_table("zb-h1", p, m)[rank])
