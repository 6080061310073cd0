"""search_heterogeneous: the planner for mixed GPU types or uneven networks.

1. Start shapes from the hierarchical partition (graph_partition): 1..MAX_PIPELINES pipelines, one
   or two stages per node piece, stages ordered along fast links (a single pipeline in reverse order
   too). The plan's ``search.partitioner`` says whether METIS or the greedy cut grouped the pipelines
   (pymetis is optional).
2. Each shape is realised (realise.py: per-stage tables, exact layer split per pipeline, batch shares
   by speed) with fast screening tables (one micro-batch size per pipeline, the best guess), and the
   LOCAL_STARTS best are improved by local search (local_search.py).
3. A second local search from the winner solves WIDE_TRIES micro-batch sizes per pipeline and splits
   pipelines again after their shares move.
4. The winner is split again with exact tables (the frontier DP without thinning).
5. Baselines: the best single-GPU-type subset and the plan made as if every GPU were the slowest;
   the latter is a plan for this cluster, so when it scores better it is returned: the result is
   never worse than a baseline that can run on the whole cluster.
The score of every candidate is ``estimate_plan(plan).step_time_s``, so the reported figures are the
optimised ones. ``opts.time_budget_s`` stops the search at the next shape (steps 3-5 are skipped).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError, NoFitError
from autopar.estimate import CostCache, estimate_plan
from autopar.modelspec.spec import ModelSpec
from autopar.plan.validate import validate_plan
from autopar.search.hetero.baselines import AS_SLOWEST, SUBSET, as_slowest_gpu, best_homogeneous_subset
from autopar.search.hetero.graph_partition import describe_partitioner, initial_shapes
from autopar.search.hetero.layer_split import LayerSplitter
from autopar.search.hetero.local_search import improve
from autopar.search.hetero.realise import Candidate, Realiser
from autopar.search.options import SearchOptions, nothing_fits_fix
from autopar.search.progress import progress_bar
from autopar.search.result import HETEROGENEOUS, SearchResult
from autopar.search.rules import rule_counts
from autopar.version import __version__

SCREEN_BUCKETS = 32  # memory buckets per frontier while screening shapes (layer_split.ThinTrie)
MAX_PIPELINES = 8
SCREEN_TRIES = 1  # micro-batch sizes solved per pipeline while screening (best guesses first)
LOCAL_STARTS = 3  # best distinct start shapes improved by local search
WIDE_TRIES = 4  # micro-batch sizes solved per pipeline in the second local search


def search_heterogeneous(model: ModelSpec, cluster: Cluster, global_batch_size: int, opts: SearchOptions,
                         with_baselines: bool = True) -> SearchResult:
    """The fastest asymmetric plan found under the cost model, with its estimate and, when asked, the
    baselines (the as-slowest plan is returned instead when it scores better).

    The estimate is ``estimate_plan`` of the returned plan and equals the figure the search scored
    (to 1e-9, else RuntimeError). Raises AutoparError when no plan fits the devices' memory.
    """
    start = time.perf_counter()
    deadline = start + opts.time_budget_s if opts.time_budget_s else None
    best, info = plan_search(model, cluster, global_batch_size, opts, deadline)
    seconds = time.perf_counter() - start
    base: dict = {}
    base_start, base_seconds = time.perf_counter(), 0.0
    if with_baselines:  # under a time budget, the baselines get what is left of it
        rest = opts if deadline is None else replace(opts, time_budget_s=max(deadline - time.perf_counter(), 1e-3))
        bar = progress_bar(2, opts.progress, "baselines", "family")  # each a homogeneous search, with its own bar
        base[SUBSET] = best_homogeneous_subset(model, cluster, global_batch_size, rest)
        bar.update(1)
        base[AS_SLOWEST] = as_slowest_gpu(model, cluster, global_batch_size, rest)
        bar.update(1)
        bar.close()
        base_seconds = time.perf_counter() - base_start
    plan, reported = best.plan, best.time
    slow = base.get(AS_SLOWEST)
    if slow is not None and slow[1].step_time_s < reported:
        plan, reported = replace(slow[0]), slow[1].step_time_s
        info["returned"] = AS_SLOWEST
    est = estimate_plan(plan, model, opts.params)
    if abs(est.step_time_s - reported) > 1e-9 * reported:
        raise RuntimeError(f"internal: the heterogeneous search scored {reported!r} but the plan estimates "
                           f"{est.step_time_s!r}; the search and estimate_plan disagree")
    sub = base.get(SUBSET)
    if sub is not None and sub[1].tokens_per_s > est.tokens_per_s:
        # Plans use every device (ranks are device ids), so a faster subset can only be pointed out.
        info["note"] = (f"the best homogeneous subset ({sub[0].cluster.describe()}, {sub[0].world_size} devices) "
                        f"trains {sub[1].tokens_per_s / est.tokens_per_s:.2f}x faster: leave the other nodes out")
    plan.predicted = est.predicted()
    plan.search = _search_block(opts, info, seconds)
    validate_plan(plan, model, est.memory_gib)
    return SearchResult(HETEROGENEOUS, plan, est, seconds, info["candidates"], dict(plan.search["pruned"]),
                        timed_out=info["timed_out"], baselines=base, baseline_seconds=base_seconds)


def plan_search(model: ModelSpec, cluster: Cluster, B: int, opts: SearchOptions, deadline: float | None
                ) -> tuple[Candidate, dict]:
    """The planner proper (no baselines): best candidate plus search statistics."""
    max_stages = model.num_layers
    screen = LayerSplitter(model, cluster, opts, buckets=SCREEN_BUCKETS)
    costs = CostCache()  # one memo of layer costs for every realiser of this search
    realise = Realiser(model, cluster, B, opts, screen, tries=SCREEN_TRIES, cache=costs)
    timed_out = False
    starts: list[Candidate] = []
    cuts: Counter = Counter()
    shapes = list(initial_shapes(cluster, min(MAX_PIPELINES, cluster.num_devices, B), max_stages, cuts))
    # A single pipeline's stages in reverse too: the simulated schedule's fill and drain favour the heavy
    # (or slow) stage first or last depending on the stages, not always memory-rich first.
    shapes += [rev for rev in ((s[0][::-1],) for s in shapes if len(s) == 1) if rev not in shapes]
    bar = progress_bar(len(shapes), opts.progress, "shapes", "shape")
    for shape in shapes:
        if deadline is not None and time.perf_counter() > deadline and starts:
            timed_out = True
            break
        c = realise(shape)
        if c is not None:
            starts.append(c)
        bar.update(1)
    bar.close()
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
    if not timed_out:  # second pass: more micro-batch sizes per pipeline, shares re-split
        wide = Realiser(model, cluster, B, opts, screen, tries=WIDE_TRIES, resplit=True, cache=costs)
        first = wide(best.shape)
        if first is not None:
            c, timed_out = improve(wide, first, cluster, max_stages, deadline)
            if c.time < best.time:
                best = c
        realise.evaluated += wide.evaluated
    exact = LayerSplitter(model, cluster, opts, buckets=None)
    if not timed_out:
        exact_realise = Realiser(model, cluster, B, opts, exact, tries=2, resplit=True, cache=costs)
        for polished in (polish(best, exact_realise), exact_realise(best.shape)):
            if polished is not None and polished.time < best.time:
                best = polished
    info = {"candidates": screen.candidates + exact.candidates, "pruned": screen.pruned + exact.pruned,
            "timed_out": timed_out, "shapes": realise.evaluated, "tables": screen.builds + exact.builds,
            "start_shapes": len(starts), "partitioner": describe_partitioner(cuts)}
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
    """One line saying how far the closest single pipeline over every device is from fitting: its need over
    the room the tightest device has beside the framework reserve (``CostParams.reserve_gib``)."""
    margin = cluster.memory_margin
    fix = nothing_fits_fix(opts, margin)
    cap = "--memory-budget" if opts.memory_budget_gib else f"its GPU's memory{' less the margin' if margin else ''}"
    reserve = opts.params.reserve_gib
    least = min(cluster.budget_gib(d, opts.memory_budget_gib) for d in cluster.first_devices())  # alike in a node
    if least <= reserve:  # no room at all: a ratio to nothing would be meaningless
        return NoFitError(f"no plan fits {cluster.describe()}: {cap} ({least:.3g} GiB on the tightest device) leaves "
                          f"no room beside the {reserve:g} GiB framework reserve", fix)
    ratio = min(splitter.least_memory_ratio(list(shape[0]), 1, B)
                for shape in initial_shapes(cluster, 1, model.num_layers))
    what = (f"needs at least {ratio:.2f}x the room its tightest device has ({cap} less the {reserve:g} GiB "
            "framework reserve)" if ratio < float("inf") else "has a layer with no legal strategy")
    return NoFitError(f"no plan fits {cluster.describe()}: the closest, one pipeline over all devices with "
                      f"micro-batches of 1, {what}", fix)


def _search_block(opts: SearchOptions, info: dict, seconds: float) -> dict:
    """The ``search`` block of the plan file."""
    return {
        "autopar_version": __version__,
        "planner": HETEROGENEOUS,
        "partitioner": info["partitioner"],  # METIS, or the greedy cut and why (pymetis is optional)
        "seconds": round(seconds, 4),
        **({"max_tp": opts.max_tp} if opts.max_tp is not None else {}),
        "candidates": int(info["candidates"]),
        "shapes": int(info["shapes"]),
        "stage_tables": int(info["tables"]),
        "pruned": rule_counts(info["pruned"]),
        "timed_out": bool(info["timed_out"]),
        "returned": info.get("returned", "planner"),
        "cost_params": opts.params.to_dict(),
        **({"note": info["note"]} if "note" in info else {}),
    }
