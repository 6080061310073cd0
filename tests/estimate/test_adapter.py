"""The adapter: a stage on a Cluster as the cost model's numbers, and the caller-owned CostCache."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.estimate import CostCache, StageContext, estimate_plan, stage_cost, stage_link
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from cost_models import CostParams
from cost_models.layer import one_layer_cost
from tests.search.tiny import SMALL_GPU, gpt_like, small_cluster

GB = 1e9


def test_stage_links_from_the_cluster():
    c = small_cluster(nodes=2, per_node=2, inter_gbps=5.0)  # 100 GB/s inside a node, 5 GB/s between
    ctx = StageContext(c, (0, 1, 2, 3), 4, 1)
    tp2 = ctx.tp_links(2)  # (0, 1) and (2, 3): inside nodes
    assert (tp2.size, tp2.n_local, tp2.n_nodes) == (2, 2, 1)
    dp = ctx.dp_links(2)  # (0, 2) and (1, 3): across nodes, 2 ranks of the stage share each node's network
    assert (dp.size, dp.n_local, dp.n_nodes) == (2, 1, 2)
    assert dp.inter_bw == pytest.approx(5.0 * GB / 2) and dp.inter_lat == pytest.approx(20e-6)
    assert ctx.stage_links.size == 4 and ctx.stage_links.n_nodes == 2
    assert ctx.peak_flops == SMALL_GPU.flops and ctx.hbm_bw == pytest.approx(500 * GB)
    assert ctx.collectives.hbm_bw == ctx.hbm_bw and ctx.collectives.params == ctx.params
    assert stage_link(c, [0, 1], [2, 3]) == pytest.approx((5.0 * GB, 20e-6))



def test_stage_link_counts_the_node_links_a_boundary_uses_at_once():
    """A stage spanning k nodes sends to the next stage's nodes over k node links in parallel; stages
    that share a node are charged that node's one link (before, every boundary got one node link)."""
    c = small_cluster(nodes=6, per_node=2, inter_gbps=5.0)
    assert stage_link(c, [0, 1, 2, 3], [4, 5, 6, 7]) == pytest.approx((2 * 5.0 * GB, 20e-6))  # 2 nodes -> 2 nodes
    assert stage_link(c, [0, 1, 2, 3, 4, 5], [6, 7]) == pytest.approx((5.0 * GB, 20e-6))  # 3 nodes -> 1 node
    assert stage_link(c, [0, 1, 2], [3, 4, 5, 6, 7]) == pytest.approx((5.0 * GB, 20e-6))  # node 1 holds both

def test_equal_stages_share_a_shape_key():
    c = small_cluster(nodes=2, per_node=2)
    assert StageContext(c, (0, 1), 4, 2).shape_key == StageContext(c, (2, 3), 4, 2).shape_key
    assert StageContext(c, (0, 1), 4, 2).shape_key != StageContext(c, (1, 2), 4, 2).shape_key


def test_cache_is_exact_and_keeps_clusters_apart():
    m = gpt_like()
    slow = small_cluster()
    fast = replace(slow, nodes=[replace(nd, gpu=replace(SMALL_GPU, tflops=100.0)) for nd in slow.nodes])
    cache = CostCache()
    ly, s = m.layers[1], Strategy(2, 1, "none")
    a = cache.layer_cost(ly, s, StageContext(slow, (0, 1), 4, 2))
    b = cache.layer_cost(ly, s, StageContext(fast, (0, 1), 4, 2))
    assert a == one_layer_cost(ly, s, StageContext(slow, (0, 1), 4, 2)) and b.fwd < a.fwd
    # a repeated block (another name, same numbers) is the same entry
    assert cache.layer_cost(m.layers[2], s, StageContext(slow, (2, 3), 4, 2)) is a
    ctx = StageContext(slow, (0, 1), 4, 2)
    assert stage_cost(m.layers, [Strategy()] * m.num_layers, ctx, 2, cache) == \
        stage_cost(m.layers, [Strategy()] * m.num_layers, ctx, 2)


def test_estimate_with_a_shared_cache_equals_fresh_ones():
    m, c = gpt_like(), small_cluster()
    ref = ModelRef(m.name, m.seq_len, m.num_layers)
    params = CostParams(reserve_gib=0.0)
    cache = CostCache()
    for strat in (Strategy(), Strategy(2, 3, "full", True), Strategy(1, 2, "selective")):
        layers = [StageLayer(ly.name, strat if ly.tp_ok(strat.tp) else Strategy(1, strat.zero, strat.ckpt))
                  for ly in m.layers]
        plan = Plan(ref, c, 8, [Pipeline(8, 4, 2, [Stage([0, 1], layers[:2]), Stage([2, 3], layers[2:])])])
        shared = estimate_plan(plan, m, params, cache)
        fresh = estimate_plan(plan, m, params)
        assert shared.step_time_s == fresh.step_time_s and shared.pipelines == fresh.pipelines


def _mixed_estimate(small_gib: float, big_gib: float):
    """One stage over a node of small GPUs and a node of big ones (gpt_like, tp 1, ZeRO 1)."""
    m = gpt_like()
    gpus = [replace(SMALL_GPU, name="lo", memory_gib=small_gib), replace(SMALL_GPU, name="hi", memory_gib=big_gib)]
    c = replace(small_cluster(), nodes=[replace(nd, gpu=g) for nd, g in zip(small_cluster().nodes, gpus)])
    layers = [StageLayer(ly.name, Strategy(1, 1, "none")) for ly in m.layers]
    plan = Plan(ModelRef(m.name, m.seq_len, m.num_layers), c, 8, [Pipeline(8, 2, 4, [Stage([0, 1, 2, 3], layers)])])
    return estimate_plan(plan, m)


def test_memory_is_per_stage_and_the_per_device_views_agree():
    """A stage's devices share its peak; its budget is its smallest device's; the per-device dicts
    (built on first read) say the same device by device."""
    peak = _mixed_estimate(1.0, 1.0).max_memory_gib
    for small, fits in ((peak * 0.99, False), (peak * 1.01, True)):
        est = _mixed_estimate(small, peak * 2)
        assert est.max_memory_gib == peak and est.stage_budget_gib == [[small]]
        assert est.memory_gib == dict.fromkeys(range(4), peak)
        assert est.budget_gib == {0: small, 1: small, 2: peak * 2, 3: peak * 2}
        assert est.fits is fits is all(est.memory_gib[d] <= est.budget_gib[d] for d in range(4))


def test_the_first_and_last_stage_name_each_other_as_tie_holders():
    from autopar.estimate.context import pipeline_contexts, tie_partner

    assert [tie_partner(i, 4) for i in range(4)] == [3, None, None, 0]
    assert tie_partner(0, 2) == 1 and tie_partner(1, 2) == 0 and tie_partner(0, 1) is None
    stages = [(0,), (1,), (2,)]
    ctxs = pipeline_contexts(small_cluster(4), stages, 2, 4, CostParams())
    assert [c.tie_devices for c in ctxs] == [(2,), (), (0,)]
