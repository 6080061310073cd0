"""What heterogeneity-awareness buys, scored by the same cost model.

* ``best_homogeneous_subset``: the best plan that uses only the nodes of one GPU type (found by the
  homogeneous search on that sub-cluster, whose devices are renumbered from 0). When one type's nodes
  do not form a homogeneous cluster (uneven network), its zones are tried one by one.
* ``as_slowest_gpu``: plan as if every GPU were the slowest type (its FLOPS, and the smallest memory,
  HBM bandwidth and links of the cluster, so the plan fits the real devices), with the homogeneous
  search, then score that plan on the real cluster with ``estimate_plan``.

Each is ``(plan, estimate)`` or None when it does not exist or nothing fits.
"""

from __future__ import annotations

from dataclasses import replace

from autopar.cluster.cluster import Cluster, Node
from autopar.errors import AutoparError
from autopar.estimate.plan_cost import PlanEstimate, estimate_plan
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from autopar.search.homogeneous import search_homogeneous
from autopar.search.options import SearchOptions

SUBSET = "best_homogeneous_subset"
AS_SLOWEST = "as_slowest_gpu"


def sub_cluster(cluster: Cluster, node_ids: list[int], name: str) -> Cluster:
    """The cluster of the given nodes only, with their links (matrices cut down to them)."""
    bw = lat = None
    if cluster.bw_matrix_gbps is not None:
        bw = [[cluster.bw_matrix_gbps[a][b] for b in node_ids] for a in node_ids]
    if cluster.lat_matrix_us is not None:
        lat = [[cluster.lat_matrix_us[a][b] for b in node_ids] for a in node_ids]
    return Cluster([cluster.nodes[i] for i in node_ids], cluster.inter_bw_gbps, cluster.inter_lat_us, bw, lat,
                   name=name)


def _homogeneous(model: ModelSpec, cluster: Cluster, B: int, opts: SearchOptions
                 ) -> tuple[Plan, PlanEstimate] | None:
    """The homogeneous planner's plan and estimate on ``cluster``; None when it is not homogeneous or nothing fits."""
    if not cluster.is_homogeneous:
        return None
    try:
        r = search_homogeneous(model, cluster, B, opts, with_baselines=False)
    except AutoparError:
        return None
    return r.plan, r.estimate


def best_homogeneous_subset(model: ModelSpec, cluster: Cluster, B: int, opts: SearchOptions
                            ) -> tuple[Plan, PlanEstimate] | None:
    """Fastest plan on the nodes of a single GPU type (or of one type in one zone)."""
    groups: dict[str, list[int]] = {}
    for i, nd in enumerate(cluster.nodes):
        groups.setdefault(nd.gpu.name, []).append(i)
    best = None
    for gname, ids in groups.items():
        subsets = [ids]
        sub = sub_cluster(cluster, ids, f"{cluster.describe()}[{gname}]")
        if not sub.is_homogeneous:
            zones: dict[str, list[int]] = {}
            for i in ids:
                zones.setdefault(cluster.nodes[i].zone, []).append(i)
            subsets = list(zones.values()) if len(zones) > 1 else [[i] for i in ids[:1]]
        for sid in subsets:
            sc = sub if sid == ids else sub_cluster(cluster, sid, f"{cluster.describe()}[{gname}:{len(sid)} nodes]")
            r = _homogeneous(model, sc, B, opts)
            if r is not None and (best is None or r[1].tokens_per_s > best[1].tokens_per_s):
                best = r
    return best


def slowest_uniform_cluster(cluster: Cluster) -> Cluster | None:
    """Every GPU as the slowest type (smallest memory, HBM and links of the cluster); None if node sizes differ."""
    if len({nd.count for nd in cluster.nodes}) != 1:
        return None
    slow = min(cluster.gpu_types, key=lambda g: (g.tflops, g.usable_memory_gib))
    gpu = replace(slow, name=f"{slow.name}-as-slowest",
                  memory_gib=min(g.usable_memory_gib for g in cluster.gpu_types),
                  hbm_gbps=min(g.hbm_bw for g in cluster.gpu_types) / 1e9, gddr_ecc=False)
    intra = min(nd.intra_bw for nd in cluster.nodes) / 1e9
    intra_lat = max(nd.intra_lat_us for nd in cluster.nodes)
    n = cluster.num_nodes
    links = [cluster.node_link(a, b) for a in range(n) for b in range(n) if a != b]
    inter = min((bw for bw, _ in links), default=cluster.inter_bw_gbps * 1e9) / 1e9
    inter_lat = max((lt for _, lt in links), default=cluster.inter_lat_us * 1e-6) * 1e6
    nodes = [Node(gpu, nd.count, intra_bw_gbps=intra, intra_lat_us=intra_lat, name=nd.name) for nd in cluster.nodes]
    return Cluster(nodes, inter_bw_gbps=inter, inter_lat_us=inter_lat, name=f"{cluster.describe()} as slowest")


def as_slowest_gpu(model: ModelSpec, cluster: Cluster, B: int, opts: SearchOptions
                   ) -> tuple[Plan, PlanEstimate] | None:
    """The uniform plan for the all-slowest cluster, scored on the real one."""
    uniform = slowest_uniform_cluster(cluster)
    if uniform is None:
        return None
    r = _homogeneous(model, uniform, B, opts)
    if r is None:
        return None
    plan = replace(r[0], cluster=cluster, predicted={}, search={"baseline": AS_SLOWEST})
    try:
        est = estimate_plan(plan, model, opts.params)
    except AutoparError:
        return None
    if not est.fits:
        return None
    plan.predicted = est.predicted()
    return plan, est
