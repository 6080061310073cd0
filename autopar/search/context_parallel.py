"""Context parallel in the search: one CP degree per pipeline, tried as an outer level of the tree.

A plan's pipeline has one cp (autopar/plan/cp_rules.py: the sequence stays split the same way through
every stage), so cp is not a per-layer choice of the layer DP: the homogeneous planner runs once per
degree (``SearchOptions.cp``: every strategy it enumerates carries it, ``space.enumerate_strategies``)
and the fastest plan wins. Which degrees: 1 always; for sequences of at least ``CP_MIN_SEQ`` tokens the
powers of two c with at least ``CP_MIN_TOKENS`` tokens per rank (below that the K/V all-gather is a
larger share than the attention it serves) that split the sequence into 2c chunks and fit the cluster.
``SearchOptions.cp_degrees`` overrides the choice. Shorter sequences search exactly as before.
The heterogeneous planner searches cp 1 only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError, NoFitError
from autopar.modelspec.spec import ModelSpec
from autopar.search.options import SearchOptions
from autopar.search.result import SearchResult

CP_MIN_SEQ = 16384
CP_MIN_TOKENS = 8192

Planner = Callable[[ModelSpec, Cluster, int, SearchOptions, bool], SearchResult]


def cp_degrees(seq_len: int, num_devices: int) -> tuple[int, ...]:
    """The CP degrees tried by default for a sequence of ``seq_len`` tokens on ``num_devices``."""
    out = [1]
    c = 2
    while seq_len >= CP_MIN_SEQ and seq_len // c >= CP_MIN_TOKENS and c <= num_devices:
        if seq_len % (2 * c) == 0:
            out.append(c)
        c *= 2
    return tuple(out)


def search_over_cp(planner: Planner, model: ModelSpec, cluster: Cluster, global_batch_size: int,
                   opts: SearchOptions, with_baselines: bool) -> SearchResult:
    """``planner`` once per CP degree; the fastest plan, with cp 1's baselines and every degree's outcome
    in ``plan.search["cp"]`` (step time, or why none). ``seconds`` is all the searches' time; candidate
    and pruning counts are the winning degree's. Raises the first degree's error when none gives a plan."""
    degrees = opts.cp_degrees or cp_degrees(model.seq_len, cluster.num_devices)
    bad = [c for c in degrees if not isinstance(c, int) or c < 1 or model.seq_len % (2 * c) and c > 1]
    if bad:
        raise AutoparError("cp_degrees", f"{bad[0]!r} cannot split sequence length {model.seq_len} into 2 x cp "
                           "equal chunks", "give degrees c >= 1 with the sequence length a multiple of 2c")
    if degrees == (1,):
        return planner(model, cluster, global_batch_size, replace(opts, cp=1), with_baselines)
    start = time.perf_counter()
    deadline = start + opts.time_budget_s if opts.time_budget_s is not None else None
    results: dict[int, SearchResult] = {}
    errors: dict[int, AutoparError] = {}
    for c in degrees:
        left = None if deadline is None else max(deadline - time.perf_counter(), 1e-3)
        try:
            results[c] = planner(model, cluster, global_batch_size, replace(opts, cp=c, time_budget_s=left),
                                 with_baselines and c == 1)
        except AutoparError as e:
            errors[c] = e
    if not results:  # the closest of the degrees when memory is what fails, else the first degree's reason
        no_fit = [e for e in errors.values() if isinstance(e, NoFitError)]
        raise min(no_fit, key=lambda e: e.need_gib) if no_fit else errors[degrees[0]]
    best = min(results.values(), key=lambda r: r.estimate.step_time_s)
    seconds = sum(r.seconds for r in results.values())
    best.plan.search["seconds"] = round(seconds, 4)
    best.plan.search["cp"] = {str(c): (round(results[c].estimate.step_time_s, 6) if c in results
                                       else f"none: {errors[c].problem}") for c in degrees}
    if 1 in results and best is not results[1]:
        best.baselines, best.baseline_seconds = results[1].baselines, results[1].baseline_seconds
    best.seconds = seconds
    return best
