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
    T_c = max(min(flat, hier), gamma) + incast
      flat   = allreduce_time(s, P, bw, lat)            ring or tree (the faster), on the lane's slowest link:
                                                        bw = min(intra bw, inter bw / share), lat = the largest
      hier   = hierarchical_allreduce_time(s, n_local, n_nodes, intra_bw, intra_lat, inter_bw / share,
                                           inter_lat)   intra-node reduce-scatter, inter-node all-reduce,
                                                        intra-node all-gather, when the lane has several
                                                        devices on one node ("hierarchical where it helps")
      gamma  = reduction_time(s, P, hbm)                GenModel's memory-access term (slowest HBM), run
                                                        under the transfer (``Collectives.reduced``)
      incast = incast_time(s, P, f, bw)                 GenModel's incast term with delta = 1: a stage of n_j
                                                        devices holds its part of the chunk on n_j / k
                                                        devices, so f = ceil(max_j n_j / k) senders meet the
                                                        one device of the smallest stage
      share  = the most lanes with a device on one node: they share that node's network bandwidth
      every bw above at ``CostParams.link_efficiency`` of the link's, as ``cost_models.collectives`` prices
    T_l = max_c T_c
    Lanes are always priced by the formulas: a profile's measured fits cover the groups inside a stage.

Exposure. Pipeline j finishes its last backward through l at ``T_j - R_j(l)``, where R_j(l) is the
backward still to run after it on the last micro-batch: the per-micro-batch backward (and p2p) of
every earlier stage of j, plus the backward of the layers before l in its own stage. The sync of l
can start once every pipeline is there: ``ready_l = max_j (T_j - R_j(l))``. The syncs share the
network, so they run one after another in order of readiness (last layers first):

    F = 0;  for l by ready_l:  F = max(F, ready_l) + T_l
    exposed = max(0, F - max_j T_j)

and the step time is ``max_j T_j + exposed``. The intra-stage reduce-scatter / all-gather around the
cross-pipeline all-reduce (the hierarchical split of one big all-reduce) is the stage's own DP sync,
already charged in ``layer_costs``; the optimizer update is too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cost_models import communication as comm
from cost_models.collectives import GroupLinks


@dataclass
class LayerSync:
    name: str
    seconds: float  # T_l: the cross-pipeline all-reduce of this layer's gradient
    ready_s: float  # when the last pipeline has finished its backward through the layer
    done_s: float  # when its sync finishes (syncs run one after another)


@dataclass(frozen=True)
class StageBackward:
    """What the sync needs of one stage: its layers in forward order with their backward seconds per
    micro-batch, and the stage's whole backward and boundary send per micro-batch."""

    layers: Sequence[str]
    layer_bwd_s: Sequence[float]
    bwd_s: float
    p2p_s: float


def lanes(stage_sizes: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Per lane c < k = min_j n_j: its (pipeline j, index into D_j) = (j, floor(c * n_j / k))."""
    k = min(stage_sizes)
    return [[(j, (c * n) // k) for j, n in enumerate(stage_sizes)] for c in range(k)]


def layer_sync_time(grad_bytes: float, stage_sizes: Sequence[int], lane_links: Sequence[GroupLinks],
                    hbm_bw: float, link_efficiency: float = 1.0) -> float:
    """T_l of the module docstring: the slowest lane's all-reduce of its chunk of ``grad_bytes``.

    ``lane_links``: per lane (``lanes`` order) its links, the network share already divided by the
    lanes meeting on one node; ``hbm_bw``: the slowest HBM among the stages; ``link_efficiency``: the
    fraction of those links' bandwidth the collective reaches (``CostParams.link_efficiency``).
    """
    P = len(stage_sizes)
    if P <= 1 or grad_bytes <= 0:
        return 0.0
    k = min(stage_sizes)
    s = grad_bytes / k
    fan_in = math.ceil(max(stage_sizes) / k)
    worst = 0.0
    for g in (lane.at_efficiency(link_efficiency) for lane in lane_links):
        bw, lat = g.slowest
        flat = float(comm.allreduce_time(s, P, bw, lat))
        hier = float(comm.hierarchical_allreduce_time(s, g.n_local, g.n_nodes, g.intra_bw, g.intra_lat,
                                                      g.inter_bw, g.inter_lat))
        gamma = float(comm.reduction_time(s, P, hbm_bw))
        incast = comm.incast_time(s, P, fan_in, bw)
        worst = max(worst, max(min(flat, hier), gamma) + incast)  # reduced under the transfer, as Collectives.reduced
    return worst


def ready_times(pipelines: Sequence[tuple[float, Sequence[StageBackward]]]) -> dict[str, float]:
    """ready_l of the module docstring, per layer name, from each pipeline's (T_j, stages)."""
    ready: dict[str, float] = {}
    for T, stages in pipelines:
        behind = 0.0  # backward of the last micro-batch still to run in earlier stages
        for st in stages:
            inside = 0.0
            for name, bwd in zip(st.layers, st.layer_bwd_s):  # earlier layers run their backward later
                r = T - (behind + inside)
                ready[name] = max(ready.get(name, -math.inf), r)
                inside += bwd
            behind += st.bwd_s + st.p2p_s  # then the gradient crosses back to this stage
    return ready


def sync_schedule(ready: Mapping[str, float], seconds: Mapping[str, float],
                  position: Mapping[str, int]) -> list[LayerSync]:
    """The syncs in the order they run (by readiness, later layers first on ties), with their ends."""
    order = sorted(ready, key=lambda n: (ready[n], -position[n]))
    out, F = [], 0.0
    for name in order:
        F = max(F, ready[name]) + seconds[name]
        out.append(LayerSync(name, seconds[name], ready[name], F))
    return out


def exposed_sync_time(schedule: Sequence[LayerSync], pipeline_times: Sequence[float]) -> float:
    """Seconds of sync left after the slowest pipeline finishes."""
    if not schedule:
        return 0.0
    return max(0.0, schedule[-1].done_s - max(pipeline_times))
