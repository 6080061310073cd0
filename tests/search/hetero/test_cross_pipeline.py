"""Cross-pipeline gradient sync: the formula of autopar/estimate/cross_pipeline.py on hand-computed cases,
and how estimate_plan adds its exposed part to the slowest pipeline."""

import pytest

from autopar.estimate import estimate_plan
from autopar.estimate.cross_pipeline import cross_pipeline_sync_time, layer_sync_time, sync_schedule
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from tests.search.hetero.hetlib import PARAMS, mixed, model

BW, LAT = 5e9 * PARAMS.link_efficiency, 20e-6  # mixed(): 5 GB/s, 20 us between nodes, as collectives reach them
HBM = 500e9  # the slow GPU's HBM (the lane's slowest)


def S(params):
    return params * PARAMS.grad_comm_bytes


def test_two_single_devices_across_nodes():
    c = mixed()
    p = 1_000_000
    # ring of 2: 2 (1/2) S / bw + 2 lat (beats the tree's 2 S / bw); GenModel gamma 3 (1/2) S / hbm under it; no incast
    expected = max(S(p) / BW + 2 * LAT, 1.5 * S(p) / HBM)
    assert layer_sync_time(c, [(0,), (2,)], p, PARAMS) == pytest.approx(expected, rel=1e-12)


def test_incast_when_stage_sizes_differ():
    c = mixed()
    p = 1_000_000
    base = layer_sync_time(c, [(0,), (2,)], p, PARAMS)
    # two senders of the 2-device stage meet the one device of the other: (f - 1) (S / P) / bw more
    got = layer_sync_time(c, [(0, 1), (2,)], p, PARAMS)
    assert got == pytest.approx(base + 1 * (S(p) / 2) / BW, rel=1e-12)


def test_lanes_share_the_node_network():
    c = mixed()
    p = 1_000_000
    # 2 lanes of S/2, both leaving node 0 and node 1: each gets half the node bandwidth
    expected = max((S(p) / 2) / (BW / 2) + 2 * LAT, 1.5 * (S(p) / 2) / HBM)
    assert layer_sync_time(c, [(0, 1), (2, 3)], p, PARAMS) == pytest.approx(expected, rel=1e-12)


def test_sync_inside_a_node_is_cheaper_than_across():
    c = mixed()
    inside = layer_sync_time(c, [(2,), (3,)], 1_000_000, PARAMS)
    across = layer_sync_time(c, [(0,), (2,)], 1_000_000, PARAMS)
    assert inside < across / 10


def plan_of(c, m, pipes_devices, B=4):
    """One stage per pipeline, every unit tp1 zero0, equal shares, one sample per micro-batch."""
    layers = [StageLayer(ly.name, Strategy()) for ly in m.layers]
    share = B // len(pipes_devices)
    pipes = [Pipeline(share, 1, share, [Stage(list(devs), list(layers))]) for devs in pipes_devices]
    return Plan(ModelRef(m.name, m.seq_len, m.num_layers), c, B, pipes)


def test_exposed_sync_is_added_after_the_slowest_pipeline():
    c, m = mixed(), model()
    plan = plan_of(c, m, [[0], [2]])
    est = estimate_plan(plan, m, PARAMS)
    exposed = cross_pipeline_sync_time(plan, m, PARAMS)
    assert est.step_time_s == pytest.approx(max(est.pipeline_times_s) + exposed, rel=1e-12)
    sched = sync_schedule(plan, m, PARAMS)
    per_layer = {x.name: x.seconds for x in sched}
    # the first unit's backward ends last (at T), so at least its sync is exposed; at most all of them
    assert per_layer[m.layers[0].name] - 1e-15 <= exposed <= sum(per_layer.values()) + 1e-15
    # syncs run one after another, each no earlier than its layer is ready
    done = 0.0
    for x in sched:
        assert x.done_s == pytest.approx(max(done, x.ready_s) + x.seconds, rel=1e-12)
        done = x.done_s


def test_one_pipeline_has_no_cross_sync():
    c, m = mixed(), model()
    plan = plan_of(c, m, [[0, 1, 2, 3]])
    assert cross_pipeline_sync_time(plan, m, PARAMS) == 0.0
