"""The simulated pipeline step (what plans are priced by) against the independent discrete-event oracle
(tests/cost_models/schedule_sim.py), its proven lower bound, and the closed form it replaced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.pipeline import (
    action_times,
    fill_factor,
    pipeline_lower_bound,
    pipeline_time,
    simulate_pipeline,
    simulated_pipeline_time,
)
from tests.cost_models.schedule_sim import simulate_step as oracle

times = st.floats(0.01, 5.0, allow_nan=False, allow_infinity=False)


@st.composite
def pipelines(draw, max_stages: int = 6):
    """(p, m, forward, backward, sends, tails, slot cost) of a random uneven pipeline."""
    p, m = draw(st.integers(1, max_stages)), draw(st.integers(1, 12))
    f = draw(st.lists(times, min_size=p, max_size=p))
    b = draw(st.lists(times, min_size=p, max_size=p))
    d = draw(st.lists(st.floats(0.0, 6.0), min_size=p - 1, max_size=p - 1)) + [0.0]
    s = draw(st.lists(st.floats(0.0, 4.0), min_size=p, max_size=p))
    o = draw(st.sampled_from([0.0, 0.05, 0.5]))
    return p, m, f, b, d, s, o


def _costs(f, b, s, m, o):
    """Per-micro-batch costs ``w + s / m`` whose ``action_times`` are (f + o / 2, b + o / 2)."""
    return [fi + bi + si / m for fi, bi, si in zip(f, b, s)]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 17])
def test_equal_stages_with_free_sends_give_the_closed_form(schedule, p, m):
    """(m + p - 1)(w + o) + s, for any forward/backward split, tail and slot cost."""
    f, b, s, o = 1.25, 2.5, 3.0, 0.125
    t = simulated_pipeline_time(schedule, m, _costs([f] * p, [b] * p, [s] * p, m, o), [f] * p, [s] * p, [0.0] * p, o)
    assert t == pytest.approx((m + p - 1) * (f + b + o) + s, rel=1e-12)
    assert t == pytest.approx(pipeline_time(_costs([f] * p, [b] * p, [s] * p, m, o), [0.0] * p, m, o,
                                            steps=[s] * p), rel=1e-12)


def test_the_forward_backward_split_is_the_stage_costs():
    """One place splits a stage's cost into actions: forward as priced, the rest of w backward, o halved."""
    f, b = action_times(cost=3.0 + 2.0 / 4, fwd=1.0, step=2.0, num_microbatches=4, slot_overhead_s=0.5)
    assert (f, b) == pytest.approx((1.25, 2.25))


@settings(max_examples=300, deadline=None)
@given(pipelines(), st.sampled_from(["1f1b", "gpipe"]))
def test_the_simulation_is_the_oracle_when_no_link_queues(case, schedule):
    """Sends no longer than the actions that issue them never queue on a link: then the runtime-table
    simulation equals the independent oracle (textbook orders, tails once per stage) to rounding."""
    p, m, f, b, d, s, o = case
    fa = [x + o / 2 for x in f]
    ba = [x + o / 2 for x in b]
    d = [min(di, fa[i], ba[i + 1]) for i, di in enumerate(d[:-1])] + [0.0]
    t = simulated_pipeline_time(schedule, m, _costs(f, b, s, m, o), f, s, d, o)
    assert t == pytest.approx(oracle(fa, ba, d[:-1], s, m, schedule), rel=1e-9, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(pipelines(), st.sampled_from(["1f1b", "gpipe"]))
def test_the_lower_bound_holds_on_random_uneven_pipelines(case, schedule):
    """``pipeline_lower_bound`` (the search's pruning bound) never exceeds the simulated step, with slow
    links (queues included), tails and slot costs; it is tight for one stage or one micro-batch."""
    p, m, f, b, d, s, o = case
    t = simulated_pipeline_time(schedule, m, _costs(f, b, s, m, o), f, s, d, o)
    work, cost = sum(f) + sum(b), sum(_costs(f, b, s, m, o))
    assert pipeline_lower_bound(work, cost, p, m, o) <= t * (1 + 1e-12)
    share = max(fi / (fi + bi) for fi, bi in zip(f, b))
    assert pipeline_lower_bound(work, cost, p, m, o, fwd_share=share, schedule=schedule) <= t * (1 + 1e-12)
    if p == 1 or (m == 1 and not any(d) and not any(s)):
        assert pipeline_lower_bound(work, cost, p, m, o) == pytest.approx(t, rel=1e-12)


def test_the_forward_share_tightens_the_1f1b_bound_on_equal_stages():
    """Equal stages, forward a third of the work, p = 8, m = 32: with the forward share the 1F1B bound
    passes the fill-factor bound (111.7 vs 107.0) and stays below the schedule's (m + p - 1) w = 117."""
    p, m = 8, 32
    t = simulated_pipeline_time("1f1b", m, [3.0] * p, [1.0] * p, [0.0] * p, [0.0] * p)
    plain = pipeline_lower_bound(3.0 * p, 3.0 * p, p, m)
    tight = pipeline_lower_bound(3.0 * p, 3.0 * p, p, m, fwd_share=1 / 3)
    assert plain < tight <= t * (1 + 1e-12) and t == pytest.approx((m + p - 1) * 3.0)
    assert tight == pytest.approx(24.0 * (1 + 1 / sum(1 / (31 - min(7 - k, 31) / 2) for k in range(8))))


def test_the_fill_factor_is_between_the_bounds_it_interpolates():
    """f(p, m) = 1 / (1 - (1 - 1/m)^p): m at p = 1, 1 at m = 1, and m/p + (p - 1)/(2p) <= f <= (m + p - 1)/p
    (the equal-stage step over the total work), so the bound never passes an equal-stage pipeline."""
    assert fill_factor(1, 7) == pytest.approx(7) and fill_factor(5, 1) == 1.0
    for p in range(1, 20):
        for m in range(1, 40):
            f = fill_factor(p, m)
            assert m / p + (p - 1) / (2 * p) - 1e-9 <= f <= (m + p - 1) / p + 1e-9


def test_the_closed_form_is_no_bound_either_way():
    """A slow first stage: the closed form adds the later stages' fill the schedule overlaps (too high).
    A slow link: the closed form crosses it once each way, the schedule once per micro-batch (too low)."""
    f, b, s = [0.55, 0.5], [0.55, 0.5], [0.0, 0.0]
    sim = simulated_pipeline_time("1f1b", 2, _costs(f, b, s, 2, 0.0), f, s, [0.0, 0.0])
    assert sim == pytest.approx(3.1) and pipeline_time(_costs(f, b, s, 2, 0.0), [0.0, 0.0], 2) == pytest.approx(3.2)
    f, b, d, m = [1.0] * 4, [2.0] * 4, [5.0, 5.0, 5.0, 0.0], 8
    sim = simulated_pipeline_time("1f1b", m, _costs(f, b, [0.0] * 4, m, 0.0), f, [0.0] * 4, d)
    closed = pipeline_time(_costs(f, b, [0.0] * 4, m, 0.0), [2 * x for x in d], m)
    assert closed == pytest.approx((m + 3) * 3.0 + 30.0) and sim > 1.75 * closed


def test_a_link_carries_one_transfer_at_a_time():
    """GPipe, 2 stages, sends (3 s) slower than the actions (1 s): forwards reach stage 1 at 4, 7, 10, 13 and
    gradients stage 0 at 18, 21, 24, 27 (a link with no queue would deliver them 1 s apart: step 22)."""
    sim = simulate_pipeline("gpipe", 4, [2.0, 2.0], [1.0, 1.0], [0.0, 0.0], [3.0, 0.0], record=True)
    assert sim.step_s == pytest.approx(28.0)
    assert [sim.sends[("F", k, 0)][1] for k in range(4)] == pytest.approx([4.0, 7.0, 10.0, 13.0])
    assert [sim.sends[("B", k, 1)][1] for k in range(4)] == pytest.approx([18.0, 21.0, 24.0, 27.0])
    assert [t for slot in sim.slots[1][:4] for t in slot] == pytest.approx([4.0, 5.0, 7.0, 8.0, 10.0, 11.0, 13.0, 14.0])


def test_a_stage_pays_its_tail_once_after_its_last_slot():
    sim = simulate_pipeline("1f1b", 3, [3.0 + 0.5 / 3, 3.0], [1.0, 1.0], [0.5, 0.0], [0.0, 0.0])
    assert sim.step_s == pytest.approx(max(sim.ends[0] + 0.5, sim.ends[1]))
    assert sim.ends[0] == pytest.approx((3 + 2 - 1) * 3.0)
