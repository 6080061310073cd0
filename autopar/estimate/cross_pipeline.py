"""Gradient sync across the pipelines of a Plan: its devices made into lanes and links, its pipelines
into ready times; the formula, the schedule and the exposure are ``cost_models.cross_pipeline``'s."""

from __future__ import annotations

from autopar.cluster.cluster import Cluster
from autopar.estimate.cache import CostCache
from autopar.estimate.context import chunk_contexts
from autopar.estimate.interleaved import estimate_any
from autopar.estimate.pipeline import StageEstimate
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from cost_models import CostParams
from cost_models import cross_pipeline as cp
from cost_models.collectives import GroupLinks
from cost_models.cross_pipeline import LayerSync
from cost_models.ties import held_params

__all__ = ["LayerSync", "cross_pipeline_sync_time", "lane_links", "layer_sync_time", "sync_schedule"]


def lane_links(cluster: Cluster, stage_devices: list[tuple[int, ...]]) -> list[GroupLinks]:
    """Per lane (``cost_models.cross_pipeline.lanes``) its links; lanes leaving one node share its network.

    Links come from ``Cluster.group_links``: the slowest intra-node link and the slowest node pair.
    Cluster bandwidth is per node, so a lane's network share is the node's divided by the most lanes
    with a device on one node (as in ``StageContext``'s per-rank share).
    """
    lanes = [[stage_devices[j][i] for j, i in lane] for lane in cp.lanes([len(d) for d in stage_devices])]
    on_node: dict[int, int] = {}
    for lane in lanes:
        nodes = {cluster.node_of(x) for x in lane}
        if len(nodes) > 1:
            for nd in nodes:
                on_node[nd] = on_node.get(nd, 0) + 1
    share = max(on_node.values(), default=1)
    out = []
    for lane in lanes:
        n_local, n_nodes = cluster.group_layout(lane)
        ibw, ilat, xbw, xlat = cluster.group_links(lane)
        out.append(GroupLinks(len(lane), n_local, n_nodes, ibw, ilat, xbw / share if n_nodes > 1 else xbw, xlat))
    return out


def layer_sync_time(cluster: Cluster, stage_devices: list[tuple[int, ...]], params_count: int, params: CostParams,
                    cache: CostCache | None = None) -> float:
    """T_l: all-reduce of one layer's gradient across the given stages (one per pipeline)."""
    if len(stage_devices) <= 1 or params_count <= 0:
        return 0.0

    def compute() -> float:
        grad_bytes = float(params_count) * params.grad_comm_bytes
        hbm = min(cluster.gpu_of(x).hbm_bw for d in stage_devices for x in d)
        return cp.layer_sync_time(grad_bytes, [len(d) for d in stage_devices], lane_links(cluster, stage_devices),
                                  hbm, params.link_efficiency)

    if cache is None:
        return compute()
    key = (tuple(stage_devices), params_count, params.grad_comm_bytes, params.link_efficiency)
    return cache.sync_time(cluster, key, compute)


def _pipelines(plan: Plan, model: ModelSpec, params: CostParams,
               cache: CostCache) -> tuple[list[list[StageEstimate]], list[float]]:
    pipes, times = [], []
    for pipe in plan.pipelines:
        st, t = estimate_any(pipe, model, plan.cluster, plan.schedule, params, cache)
        pipes.append(st)
        times.append(t)
    return pipes, times


def sync_schedule(plan: Plan, model: ModelSpec, params: CostParams, pipes: list[list[StageEstimate]] | None = None,
                  times: list[float] | None = None, cache: CostCache | None = None) -> list[LayerSync]:
    """Per layer unit: its sync time, when it can start and when it ends, in sync order.

    ``pipes`` / ``times``: the per-stage estimates and pipeline times of ``estimate_pipeline`` when the
    caller has them (computed here otherwise).
    """
    cache = cache if cache is not None else CostCache()
    if pipes is None or times is None:
        pipes, times = _pipelines(plan, model, params, cache)
    cluster = plan.cluster
    index = model.index()
    holders: dict[str, list[tuple[int, ...]]] = {}
    held: dict[str, float] = {}  # a tied copy a unit keeps (cost_models.ties): its gradient is synced too
    backward = []
    for pipe, est, T in zip(plan.pipelines, pipes, times):
        stages = []
        for st, st_est, ctx in zip(pipe.stages, est, chunk_contexts(pipe, cluster, params)):
            names = [ly.name for ly in st.layers]
            bwds = [cache.layer_cost(model.layers[index[ly.name]], ly.strategy, ctx).bwd for ly in st.layers]
            for name in names:
                holders.setdefault(name, []).append(tuple(st.devices))
                held[name] = max(held.get(name, 0.0), held_params(model.layers[index[name]], ctx, params))
            stages.append(cp.StageBackward(names, bwds, st_est.bwd_s, st_est.p2p_s))
        backward.append((T, stages))
    ready = cp.ready_times(backward)
    seconds = {n: layer_sync_time(cluster, holders[n], model.layers[index[n]].params + held[n], params, cache)
               for n in ready}
    return cp.sync_schedule(ready, seconds, index)


def cross_pipeline_sync_time(plan: Plan, model: ModelSpec, params: CostParams | None = None,
                             pipes: list[list[StageEstimate]] | None = None, times: list[float] | None = None,
                             cache: CostCache | None = None) -> float:
    """Seconds of cross-pipeline gradient sync left after the slowest pipeline finishes (0 for one pipeline)."""
    if len(plan.pipelines) <= 1:
        return 0.0
    params = params or CostParams()
    cache = cache if cache is not None else CostCache()
    if pipes is None or times is None:
        pipes, times = _pipelines(plan, model, params, cache)
    return cp.exposed_sync_time(sync_schedule(plan, model, params, pipes, times, cache), times)
