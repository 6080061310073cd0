"""Async TP in the strategy space: offered beside every sp strategy on NVLink GPUs, kept where it is faster,
never offered on other devices (counted under its rule), and chosen by a search where TP pays off."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.estimate import StageContext
from autopar.search.rules import Rule
from autopar.search.run import SearchOptions, search
from autopar.search.space import enumerate_strategies, layer_candidates, tp_degrees
from cost_models import CostParams
from tests.search.tiny import gpt_like, small_cluster

PCIE = GPUType("pcie", memory_gib=0.5, tflops=50.0, hbm_gbps=500.0, pcie_gbps=16.0)


def _ctx(cluster, n: int, params: CostParams | None = None) -> StageContext:
    return StageContext(cluster, tuple(range(n)), 4, 2, params or CostParams())


def test_offered_beside_each_sp_strategy_on_nvlink_only():
    block = gpt_like().layers[1]
    pruned: Counter = Counter()
    ctx = _ctx(small_cluster(1, 2), 2)
    out = enumerate_strategies(block, ctx, tp_degrees(ctx, pruned), pruned)
    sp = [s for s in out if s.sp and not s.async_tp]
    assert sp and [replace(s, async_tp=True) for s in sp] == [s for s in out if s.async_tp]
    assert not any(s.async_tp and not s.sp for s in out) and pruned[Rule.ASYNC_TP_NO_NVLINK] == 0

    pcie = Cluster([Node(PCIE, 2)], name="2xpcie")
    ctx = _ctx(pcie, 2)
    pruned = Counter()
    out = enumerate_strategies(block, ctx, tp_degrees(ctx, pruned), pruned)
    assert not any(s.async_tp for s in out) and pruned[Rule.ASYNC_TP_NO_NVLINK] == sum(s.sp for s in out)


def test_kept_only_where_it_is_faster():
    """With overlap 0 async TP only adds its copy: dominated, gone; with full overlap it replaces plain sp."""
    block = gpt_like(h=1024, s=1024, ffn=4096).layers[1]
    kept = {}
    for overlap in (0.0, 1.0):
        ctx = _ctx(small_cluster(1, 2), 2, CostParams(async_tp_overlap=overlap))
        pruned: Counter = Counter()
        cands = layer_candidates(block, ctx, tp_degrees(ctx, pruned), {}, pruned)
        kept[overlap] = {s for s in cands.strategies if s.sp}
    assert kept[0.0] and not any(s.async_tp for s in kept[0.0])
    assert kept[1.0] and all(s.async_tp for s in kept[1.0])


def test_search_picks_it_where_tp_pays():
    """One sample on 4 NVLink devices (TP 4 is the only way to use them): the blocks run sp with async TP
    (the embedding, with no matmul to hide behind, runs plain sp), faster than the same plan without it."""
    from autopar.estimate import estimate_plan
    from autopar.plan.schema import StageLayer

    model = gpt_like(blocks=2, h=2048, s=1024, ffn=8192)
    cluster = Cluster([Node(replace(small_cluster().nodes[0].gpu, memory_gib=4.0), 4)], name="4xsmall-4G")
    res = search(model, cluster, 1, SearchOptions(), with_baselines=False)
    layers = [ly for st in res.plan.stages for ly in st.layers]
    assert [(ly.name, ly.strategy.async_tp) for ly in layers if ly.strategy.sp] == [
        ("embed", False), ("layers.0", True), ("layers.1", True)], [ly.strategy.short() for ly in layers]
    plain = res.plan
    for st in plain.stages:
        st.layers = [StageLayer(ly.name, replace(ly.strategy, async_tp=False)) for ly in st.layers]
    assert estimate_plan(plain, model).step_time_s > res.estimate.step_time_s
