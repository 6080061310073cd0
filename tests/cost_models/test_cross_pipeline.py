"""Cross-pipeline sync over plain numbers: lanes, the lane all-reduce, readiness and exposure."""

import pytest

from cost_models import communication as comm
from cost_models.collectives import GroupLinks
from cost_models.cross_pipeline import (
    StageBackward,
    exposed_sync_time,
    lanes,
    layer_sync_time,
    ready_times,
    sync_schedule,
)

BW, LAT, HBM = 5e9, 20e-6, 500e9
ACROSS = GroupLinks(2, 1, 2, 100e9, 1e-6, BW, LAT)  # one device on each of two nodes


def test_lanes_pick_one_device_per_pipeline():
    assert lanes([1, 1]) == [[(0, 0), (1, 0)]]
    assert lanes([2, 2]) == [[(0, 0), (1, 0)], [(0, 1), (1, 1)]]
    assert lanes([4, 2]) == [[(0, 0), (1, 0)], [(0, 2), (1, 1)]]


def test_two_devices_across_nodes_hand_value():
    S = 4e6
    # ring of 2 on the network (beats the tree), gamma of half the buffer at the slower HBM under it, no incast
    expected = max(S / BW + 2 * LAT, 1.5 * S / HBM)
    assert layer_sync_time(S, [1, 1], [ACROSS], HBM) == pytest.approx(expected, rel=1e-12)
    assert layer_sync_time(S, [1], [ACROSS], HBM) == 0.0 and layer_sync_time(0.0, [1, 1], [ACROSS], HBM) == 0.0


def test_link_efficiency_slows_every_link_of_the_lane():
    S = 4e6
    assert layer_sync_time(S, [1, 1], [ACROSS], HBM, 0.5) == pytest.approx(S / (0.5 * BW) + 2 * LAT, rel=1e-12)
    base = layer_sync_time(S, [1, 1], [ACROSS], HBM, 0.5)
    assert layer_sync_time(S, [2, 1], [ACROSS], HBM, 0.5) == pytest.approx(
        base + comm.incast_time(S, 2, 2, 0.5 * BW), rel=1e-12)


def test_incast_when_stage_sizes_differ():
    S = 4e6
    base = layer_sync_time(S, [1, 1], [ACROSS], HBM)
    assert layer_sync_time(S, [2, 1], [ACROSS], HBM) == pytest.approx(base + comm.incast_time(S, 2, 2, BW), rel=1e-12)


def test_ready_schedule_and_exposure():
    # pipeline 0 (T = 10): one stage, layers a, b with backward 1 and 2; pipeline 1 (T = 8): a | b on two stages
    p0 = (10.0, [StageBackward(["a", "b"], [1.0, 2.0], 3.0, 0.0)])
    p1 = (8.0, [StageBackward(["a"], [1.0], 1.0, 0.5), StageBackward(["b"], [2.0], 2.0, 0.0)])
    ready = ready_times([p0, p1])
    # a: max(10 - 0, 8 - 0) = 10; b: max(10 - 1, 8 - 1.5) = 9
    assert ready == {"a": 10.0, "b": 9.0}
    sched = sync_schedule(ready, {"a": 0.5, "b": 2.0}, {"a": 0, "b": 1})
    assert [(x.name, x.done_s) for x in sched] == [("b", 11.0), ("a", 11.5)]
    assert exposed_sync_time(sched, [10.0, 8.0]) == pytest.approx(1.5)
    assert exposed_sync_time([], [10.0]) == 0.0
