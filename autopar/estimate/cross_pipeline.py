"""Gradient synchronisation across pipelines (data-parallel replicas of an asymmetric plan).

Inside a stage, a layer's gradient is already reduced over the stage's own DP group: ``layer_costs``
charges that (its ``step`` term). What is left when a plan has P > 1 pipelines is to all-reduce each
layer's gradient across the P stages, one per pipeline, that hold it. This module prices that and the
part of it the pipelines cannot hide. The formula, per layer unit l:

    S   = params(l) * grad_comm_bytes              the layer's whole gradient (TP and ZeRO shards inside
                                                   a stage only split it among the stage's devices)
    D_j = devices of the stage of pipeline j holding l, n_j = |D_j|, k = min_j n_j
    Lanes: the gradient is cut into k chunks of s = S / k bytes; lane c all-reduces chunk c among one
    device per pipeline, D_j[floor(c * n_j / k)]. The k lanes run at the same time.
    T_c = min(flat, hier) + gamma + incast
      flat   = allreduce_time(s, P, bw, lat)            ring or tree (the faster), on the lane's slowest link:
                                                        bw = min(intra bw, inter bw / share), lat = the largest
      hier   = hierarchical_allreduce_time(s, n_local, n_nodes, intra_bw, intra_lat, inter_bw / share,
                                           inter_lat)   intra-node reduce-scatter, inter-node all-reduce,
                                                        intra-node all-gather, when the lane has several
                                                        devices on one node ("hierarchical where it helps")
      gamma  = reduction_time(s, P, hbm)                GenModel's memory-access term (slowest HBM)
      incast = (f - 1) * (s / P) / bw                   GenModel's incast term with delta = 1 (the receiving
                                                        link is shared, no extra congestion penalty): a stage
                                                        of n_j devices holds its part of the chunk on
                                                        n_j / k devices, so f = ceil(max_j n_j / k) senders
                                                        meet the one device of the smallest stage
      share  = the most lanes with a device on one node: they share that node's network bandwidth
             (Cluster bandwidth is per node, as in StageContext's per-rank share)
      Links come from ``Cluster.group_links``: the slowest intra-node link and the slowest node pair.
    T_l = max_c T_c

Exposure. Pipeline j finishes its last backward through l at ``T_j - R_j(l)``, where R_j(l) is the
backward still to run after it on the last micro-batch: the per-micro-batch backward (and p2p) of
every earlier stage of j, plus the backward of the layers before l in its own stage. The sync of l
can start once every pipeline is there: ``ready_l = max_j (T_j - R_j(l))``. The syncs share the
network, so they run one after another in order of readiness (last layers first):

    F = 0;  for l by ready_l:  F = max(F, ready_l) + T_l
    exposed = max(0, F - max_j T_j)

and the step time is ``max_j T_j + exposed`` (``estimate_plan``). The intra-stage reduce-scatter /
all-gather around the cross-pipeline all-reduce (the hierarchical split of one big all-reduce) is
the stage's own DP sync, already charged in ``layer_costs``; the optimizer update is too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.cluster.cluster import Cluster
from autopar.estimate.layer_cost import StageContext
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from cost_models import CostParams
from cost_models import communication as comm

_SYNC_CACHE: dict = {}


@dataclass
class LayerSync:
    name: str
    seconds: float  # T_l: the cross-pipeline all-reduce of this layer's gradient
    ready_s: float  # when the last pipeline has finished its backward through the layer
    done_s: float  # when its sync finishes (syncs run one after another)


def layer_sync_time(cluster: Cluster, stage_devices: list[tuple[int, ...]], params_count: int,
                    params: CostParams) -> float:
    """T_l of the module docstring: all-reduce of one layer's gradient across the given stages (one per pipeline)."""
    P = len(stage_devices)
    if P <= 1 or params_count <= 0:
        return 0.0
    key = (id(cluster), tuple(stage_devices), params_count, params.grad_comm_bytes)
    hit = _SYNC_CACHE.get(key)
    if hit is not None and hit[1] is cluster:
        return hit[0]
    S = float(params_count) * params.grad_comm_bytes
    ns = [len(d) for d in stage_devices]
    k = min(ns)
    s = S / k
    lanes = [[d[(c * len(d)) // k] for d in stage_devices] for c in range(k)]
    spanning = [lane for lane in lanes if len({cluster.node_of(x) for x in lane}) > 1]
    on_node: dict[int, int] = {}
    for lane in spanning:
        for nd in {cluster.node_of(x) for x in lane}:
            on_node[nd] = on_node.get(nd, 0) + 1
    share = max(on_node.values(), default=1)
    fan_in = math.ceil(max(ns) / k)
    hbm = min(cluster.gpu_of(x).hbm_gbps for d in stage_devices for x in d) * 1e9
    worst = 0.0
    for lane in lanes:
        n_local, n_nodes = cluster.group_layout(lane)
        ibw, ilat, xbw, xlat = cluster.group_links(lane)
        if n_nodes > 1:
            xbw = xbw / share
            bw, lat = min(ibw, xbw), max(ilat, xlat)
        else:
            bw, lat = ibw, ilat
        flat = float(comm.allreduce_time(s, P, bw, lat))
        hier = float(comm.hierarchical_allreduce_time(s, n_local, n_nodes, ibw, ilat, xbw, xlat))
        gamma = float(comm.reduction_time(s, P, hbm))
        incast = (fan_in - 1) * (s / P) / bw
        worst = max(worst, min(flat, hier) + gamma + incast)
    if len(_SYNC_CACHE) > 100_000:
        _SYNC_CACHE.clear()
    _SYNC_CACHE[key] = (worst, cluster)
    return worst


def sync_schedule(plan: Plan, model: ModelSpec, params: CostParams, pipes=None, times=None) -> list[LayerSync]:
    """Per layer unit: its sync time, when it can start and when it ends (module docstring), in sync order.

    ``pipes`` / ``times``: the per-stage estimates and pipeline times of ``estimate_pipeline`` when the
    caller has them (computed here otherwise).
    """
    from autopar.estimate.plan_cost import _one_layer_cost, estimate_pipeline

    cluster = plan.cluster
    if pipes is None or times is None:
        pipes, times = [], []
        for pipe in plan.pipelines:
            st, t = estimate_pipeline(pipe, model, cluster, plan.schedule, params)
            pipes.append(st)
            times.append(t)
    index = model.index()
    ready: dict[str, float] = {}
    holders: dict[str, list[tuple[int, ...]]] = {}
    for pipe, est, T in zip(plan.pipelines, pipes, times):
        behind = 0.0  # backward of the last micro-batch still to run in earlier stages
        for i, st in enumerate(pipe.stages):
            ctx = StageContext(cluster, tuple(st.devices), pipe.micro_batch_size, pipe.num_microbatches, params)
            inside = 0.0
            for ly in st.layers:  # forward order: earlier layers of the stage run their backward later
                r = T - (behind + inside)
                ready[ly.name] = max(ready.get(ly.name, -math.inf), r)
                holders.setdefault(ly.name, []).append(tuple(st.devices))
                inside += _one_layer_cost(model.layers[index[ly.name]], ly.strategy, ctx)[2]
            behind += est[i].bwd_s + est[i].p2p_s  # then the gradient crosses back to stage i
    order = sorted(ready, key=lambda n: (ready[n], -index[n]))
    out, F = [], 0.0
    for name in order:
        t = layer_sync_time(cluster, holders[name], model.layers[index[name]].params, params)
        F = max(F, ready[name]) + t
        out.append(LayerSync(name, t, ready[name], F))
    return out


def cross_pipeline_sync_time(plan: Plan, model: ModelSpec, params: CostParams | None = None, pipes=None,
                             times=None) -> float:
    """Seconds of cross-pipeline gradient sync left after the slowest pipeline finishes (0 for one pipeline)."""
    if len(plan.pipelines) <= 1:
        return 0.0
    params = params or CostParams()
    if pipes is None or times is None:
        from autopar.estimate.plan_cost import estimate_pipeline

        pipes, times = [], []
        for pipe in plan.pipelines:
            st, t = estimate_pipeline(pipe, model, plan.cluster, plan.schedule, params)
            pipes.append(st)
            times.append(t)
    sched = sync_schedule(plan, model, params, pipes, times)
    if not sched:
        return 0.0
    return max(0.0, sched[-1].done_s - max(times))
