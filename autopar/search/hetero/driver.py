"""search_heterogeneous: the planner for mixed GPU types or uneven networks.

1. Start shapes from the hierarchical partition (graph_partition): 1..max pipelines, each with one
   or two stages per node piece, stages ordered along fast links.
2. Each shape is realised (realise.py: per-stage tables, exact layer split per pipeline, batch shares
   by speed) with fast screening tables, and the best few are improved by local search.
3. The winner is split again with exact tables (the frontier DP without thinning) at its batching.
4. Baselines: the best single-GPU-type subset and the plan made as if every GPU were the slowest;
   the latter is a plan for this cluster, so when it scores better it is returned (never worse than
   a baseline that can run here).
The reported figures are ``estimate_plan`` of the returned plan.
"""

from __future__ import annotations

import time

import autopar
from autopar.cluster.cluster import GIB, Cluster
from autopar.errors import AutoparError
from autopar.estimate.plan_cost import estimate_plan
from autopar.model.spec import ModelSpec
from autopar.plan.validate import validate_plan
from autopar.search.hetero.baselines import AS_SLOWEST, SUBSET, as_slowest_gpu, best_homogeneous_subset
from autopar.search.hetero.graph_partition import initial_shapes
from autopar.search.hetero.layer_split import LayerSplitter
from autopar.search.hetero.local_search import improve
from autopar.search.hetero.realise import Candidate, Realiser
from autopar.search.options import SearchOptions

SCREEN_BUCKETS = 32  # memory buckets per frontier while screening shapes (layer_split.ThinTrie)
MAX_PIPELINES = 8
LOCAL_STARTS = 3  # best distinct start shapes improved by local search


def search_heterogeneous(model: ModelSpec, cluster: Cluster, global_batch_size: int,
                         opts: SearchOptions | None = None, with_baselines: bool = True):
    """The fastest asymmetric plan found under the cost model, with its estimate and the baselines.

    Raises AutoparError when no plan fits the devices' memory.
    """
    from autopar.search.run import SearchResult

    opts = opts or SearchOptions()
    start = time.perf_counter()
    deadline = start + opts.time_budget_s if opts.time_budget_s else None
    best, info = plan_search(model, cluster, global_batch_size, opts, deadline)
    seconds = time.perf_counter() - start
    base: dict = {}
    if with_baselines:
        base = {SUBSET: best_homogeneous_subset(model, cluster, global_batch_size, opts),
                AS_SLOWEST: as_slowest_gpu(model, cluster, global_batch_size, opts)}
    plan, est = best.plan, best.estimate
    slow = base.get(AS_SLOWEST)
    if slow is not None and slow[1].step_time_s < est.step_time_s:
        plan, est = slow[0], slow[1]
        info["returned"] = AS_SLOWEST
    plan = _finish(plan, model, opts, info, seconds)
    est = estimate_plan(plan, model, opts.params)
    validate_plan(plan, model, est.memory_gib)
    return SearchResult(plan, est, seconds, info["candidates"], dict(info["pruned"]), [], info["timed_out"], base,
                        planner="heterogeneous")


def plan_search(model: ModelSpec, cluster: Cluster, B: int, opts: SearchOptions, deadline: float | None
                ) -> tuple[Candidate, dict]:
    """The planner proper (no baselines): best candidate plus search statistics."""
    max_stages = model.num_layers
    screen = LayerSplitter(model, cluster, opts, buckets=SCREEN_BUCKETS)
    realise = Realiser(model, cluster, B, opts, screen)
    timed_out = False
    starts: list[Candidate] = []
    for shape in initial_shapes(cluster, min(MAX_PIPELINES, cluster.num_devices, B), max_stages):
        if deadline is not None and time.perf_counter() > deadline and starts:
            timed_out = True
            break
        c = realise(shape)
        if c is not None:
            starts.append(c)
    if not starts:
        raise nothing_fits(model, cluster, B, opts, screen)
    starts.sort(key=lambda c: c.time)
    best = starts[0]
    for s in starts[:LOCAL_STARTS]:
        if timed_out:
            break
        c, timed_out = improve(realise, s, cluster, max_stages, deadline)
        if c.time < best.time:
            best = c
    exact = LayerSplitter(model, cluster, opts, buckets=None)
    if not timed_out:
        polished = polish(best, Realiser(model, cluster, B, opts, exact))
        if polished is not None and polished.time < best.time:
            best = polished
    info = {"candidates": screen.candidates + exact.candidates, "pruned": screen.pruned + exact.pruned,
            "timed_out": timed_out, "shapes": realise.evaluated, "tables": screen.builds + exact.builds,
            "start_shapes": len(starts)}
    return best, info


def polish(cand: Candidate, realise: Realiser) -> Candidate | None:
    """The same shape and batching with exact stage tables (re-split every pipeline)."""
    pipes = []
    for p in cand.plan.pipelines:
        sp = realise.splitter.split([tuple(st.devices) for st in p.stages], p.micro_batch_size, p.num_microbatches)
        if sp is None:
            return None
        pipes.append(sp)
    return realise.score(cand.shape, pipes)


def nothing_fits(model: ModelSpec, cluster: Cluster, B: int, opts: SearchOptions,
                 splitter: LayerSplitter) -> AutoparError:
    """One line naming what the deepest pipeline over every device would still need per device."""
    shapes = initial_shapes(cluster, 1, model.num_layers)
    need = float("inf")
    for shape in shapes:
        stages = list(shape[0])
        for mbs in (1,):
            need = min(need, splitter.least_memory(stages, mbs, B // mbs))
    budget = opts.memory_budget_gib or min(g.memory_gib for g in cluster.gpu_types)
    what = f"needs {need / GIB:.3g} GiB on some device" if need < float("inf") else "has no legal layout"
    return AutoparError("memory", f"no plan fits {cluster.describe()} (smallest GPU {budget:.3g} GiB); the "
                        f"deepest single pipeline over all devices, micro-batches of 1, {what}",
                        "add devices, raise --memory-budget, or lower --global-batch-size / --seq-len")


def _finish(plan, model: ModelSpec, opts: SearchOptions, info: dict, seconds: float):
    est = estimate_plan(plan, model, opts.params)
    plan.predicted = est.predicted()
    plan.search = {
        "autopar_version": autopar.__version__,
        "planner": "heterogeneous",
        "seconds": round(seconds, 4),
        "candidates": int(info["candidates"]),
        "shapes": int(info["shapes"]),
        "stage_tables": int(info["tables"]),
        "pruned": dict(sorted(info["pruned"].items())),
        "timed_out": bool(info["timed_out"]),
        "returned": info.get("returned", "planner"),
        "cost_params": opts.params.to_dict(),
    }
    return plan
