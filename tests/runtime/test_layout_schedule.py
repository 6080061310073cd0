"""Pure pieces of the runtime: row routing between layouts, schedules, group derivation."""

from __future__ import annotations

import itertools

import pytest

from autopar.errors import AutoparError
from autopar.plan.schema import Strategy
from autopar.runtime.groups import sync_groups, unit_rank_sets
from autopar.runtime.layout import Layout, Placement, route
from autopar.runtime.schedule import stage_slots

from .schedule_check import simulate

LAYOUTS = [Layout((0, 1, 2, 3), 1), Layout((0, 1, 2, 3), 2), Layout((0, 1, 2, 3), 4), Layout((3, 1, 0, 2), 2),
           Layout((4, 5), 2), Layout((4,), 1), Layout((4, 5, 6, 7), 2), Layout((5, 4, 7, 6), 1)]


@pytest.mark.parametrize("src,dst", list(itertools.product(LAYOUTS, LAYOUTS)))
def test_route_gives_every_destination_its_rows_once_from_a_holder(src, dst):
    mbs = 8
    transfers = route(src, dst, mbs)
    for pos, q in enumerate(dst.devices):
        lo, hi = dst.rows(pos // dst.tp, mbs)
        got = sorted((t.lo, t.hi) for t in transfers if t.dst == q)
        assert got[0][0] == lo and got[-1][1] == hi
        assert all(a[1] == b[0] for a, b in zip(got, got[1:])), "rows must tile without gaps or overlap"
    for t in transfers:
        slo, shi = src.my_rows(t.src, mbs)
        assert slo <= t.lo < t.hi <= shi, "a sender only sends rows it holds"


def test_route_keeps_rows_local_when_the_layout_allows():
    a, b = Layout((0, 1, 2, 3), 2), Layout((0, 1, 2, 3), 1)
    assert all(t.src == t.dst for t in route(a, b, 8)), "tp 2 -> tp 1 is pure slicing"
    assert any(t.src != t.dst for t in route(b, a, 8)), "tp 1 -> tp 2 gathers rows"


def test_tp_coordinates_follow_sorted_groups():
    lay = Layout((3, 1, 0, 2), 2)
    assert lay.tp_group(3) == (1, 3) and lay.tp_coord(3) == 1 and lay.tp_coord(1) == 0
    assert lay.dp_group(3) == (2, 3) and lay.dp_group(1) == (0, 1)
    assert Layout((0, 3, 2, 1), 2).fsdp_grid() is None
    assert Layout((0, 1, 2, 3), 2).fsdp_grid() == [[0, 1], [2, 3]]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stages,micro", [(1, 1), (1, 4), (2, 1), (2, 4), (3, 2), (4, 8), (5, 3)])
def test_schedules_are_complete_and_deadlock_free(schedule, stages, micro):
    for s in range(stages):
        acts = [a for slot in stage_slots(schedule, stages, s, micro) for a in slot]
        assert sorted(acts) == sorted([("F", k, 0) for k in range(micro)] + [("B", k, 0) for k in range(micro)])
        assert all(acts.index(("F", k, 0)) < acts.index(("B", k, 0)) for k in range(micro))
    assert simulate(schedule, stages, micro) >= 2 * micro


@pytest.mark.parametrize("stages,micro", [(2, 1), (2, 4), (3, 2), (4, 8), (5, 3), (8, 16)])
def test_zb_h1_table_is_complete_and_deadlock_free(stages, micro):
    """F, B and W of every micro-batch once each, W after its B; the strict model of the batches completes
    (a W slot sends and receives nothing, so it splits one batch of 1F1B's into a send and a receive)."""
    for s in range(stages):
        acts = [a for slot in stage_slots("zb-h1", stages, s, micro) for a in slot]
        assert sorted(acts) == sorted((kind, k, 0) for kind in "FBW" for k in range(micro))
        assert all(acts.index(("B", k, 0)) < acts.index(("W", k, 0)) for k in range(micro))
    assert simulate("zb-h1", stages, micro) >= 2 * micro
    with pytest.raises(AutoparError, match="at least 2 pipeline stages"):
        stage_slots("zb-h1", 1, 0, micro)


@pytest.mark.parametrize("stages,virtual,micro", [(2, 2, 2), (2, 2, 4), (2, 3, 6), (3, 2, 3), (3, 2, 9), (4, 2, 8),
                                                  (4, 3, 4), (4, 4, 16), (5, 2, 10), (8, 2, 16), (8, 4, 8)])
def test_interleaved_table_is_complete_ordered_and_deadlock_free(stages, virtual, micro):
    """Every (micro-batch, chunk) forward and backward once per stage, each forward before its backward,
    the chunks of a micro-batch forward in order on the stage and backward in reverse; and the strict
    NCCL-style model of the batches (schedule_check) completes."""
    for s in range(stages):
        acts = [a for slot in stage_slots("interleaved", stages, s, micro, virtual) for a in slot]
        want = [(kind, k, c) for kind in "FB" for k in range(micro) for c in range(virtual)]
        assert sorted(acts) == sorted(want)
        for k in range(micro):
            f = [acts.index(("F", k, c)) for c in range(virtual)]
            b = [acts.index(("B", k, c)) for c in range(virtual)]
            assert f == sorted(f) and b == sorted(b, reverse=True) and f[-1] < b[-1]
    slots = max(len(stage_slots("interleaved", stages, s, micro, virtual)) for s in range(stages))
    assert simulate("interleaved", stages, micro, virtual) >= slots


def test_one_action_per_slot_would_deadlock_the_interleaved_table(monkeypatch):
    """Why the steady state pairs a forward and a backward in one slot: without it p = 2, v = 2, m = 4 hangs."""
    import autopar.runtime.schedule as sched

    real = sched.stage_slots
    monkeypatch.setattr(sched, "stage_slots", lambda *a: [[x] for slot in real(*a) for x in slot])
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate("interleaved", 2, 4, 2)


@pytest.mark.parametrize("schedule,virtual,micro,problem", [
    ("interleaved", 1, 4, "virtual_stages >= 2"), ("1f1b", 2, 4, "needs the interleaved schedule"),
    ("interleaved", 2, 3, "multiple of the stage count"), ("zb", 1, 4, "unknown schedule"),
    ("zb-h1", 2, 4, "needs the interleaved schedule")])
def test_sizes_without_a_table_are_refused_in_one_line(schedule, virtual, micro, problem):
    with pytest.raises(AutoparError, match=problem):
        stage_slots(schedule, 2, 0, micro, virtual)


@pytest.mark.parametrize("stages,micro", [(2, 4), (4, 8), (3, 2)])
def test_1f1b_bounds_in_flight_micro_batches(stages, micro):
    for s in range(stages):
        live = peak = 0
        for kind, _, _ in (a for slot in stage_slots("1f1b", stages, s, micro) for a in slot):
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(stages - s, micro)


def _place(pipeline, devices, **kw):
    return Placement(pipeline, 0, tuple(devices), Strategy(**kw))


def test_sync_groups_aligned_and_general():
    mode, classes = sync_groups([_place(0, [0, 1, 2, 3], tp=2), _place(1, [4, 5], tp=2)])
    assert mode == "aligned"
    assert sorted(classes["sharded"].values()) == [(0, 2, 4), (1, 3, 5)]
    assert list(classes["replicated"].values()) == [(0, 1, 2, 3, 4, 5)]
    mode, classes = sync_groups([_place(0, [0, 1], tp=2), _place(1, [2], tp=1)])
    assert mode == "general" and classes["all"][()] == (0, 1, 2)
    mode, classes = sync_groups([_place(0, [0, 1], zero=3), _place(1, [2, 3], zero=3)])
    assert mode == "aligned" and sorted(classes["replicated"].values()) == [(0, 2), (1, 3)]
    assert (0, 1) in unit_rank_sets([_place(0, [0, 1], zero=3), _place(1, [2, 3], zero=3)])


def test_simulate_detects_crossed_orders(monkeypatch):
    """The checker is not vacuous: stage 0 draining backwards in reverse order deadlocks."""
    import autopar.runtime.schedule as sched

    real = sched.stage_slots

    def reversed_drain(schedule, num_stages, stage, m, v=1):
        slots = real(schedule, num_stages, stage, m, v)
        if stage == 0:
            return [s for s in slots if s[0][0] == "F"] + [[("B", k, 0)] for k in reversed(range(m))]
        return slots

    monkeypatch.setattr(sched, "stage_slots", reversed_drain)
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate("gpipe", 2, 3)
