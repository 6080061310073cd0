"""Pure pieces of the runtime: row routing between layouts, schedules, group derivation."""

from __future__ import annotations

import itertools

import pytest

from autopar.plan.schema import Strategy
from autopar.runtime.groups import sync_groups, unit_rank_sets
from autopar.runtime.layout import Layout, Placement, route
from autopar.runtime.schedule import stage_actions

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
        acts = stage_actions(schedule, stages, s, micro)
        assert sorted(acts) == sorted([("F", k) for k in range(micro)] + [("B", k) for k in range(micro)])
        assert all(acts.index(("F", k)) < acts.index(("B", k)) for k in range(micro))
    assert simulate(schedule, stages, micro) >= 2 * micro


@pytest.mark.parametrize("stages,micro", [(2, 4), (4, 8), (3, 2)])
def test_1f1b_bounds_in_flight_micro_batches(stages, micro):
    for s in range(stages):
        live = peak = 0
        for kind, _ in stage_actions("1f1b", stages, s, micro):
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

    real = sched.stage_actions

    def reversed_drain(schedule, num_stages, stage, m):
        acts = real(schedule, num_stages, stage, m)
        if stage == 0:
            return [a for a in acts if a[0] == "F"] + [("B", k) for k in reversed(range(m))]
        return acts

    monkeypatch.setattr(sched, "stage_actions", reversed_drain)
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate("gpipe", 2, 3)
