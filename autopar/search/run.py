"""search(): the front door. Picks the planner for the cluster, builds the plan, scores baselines."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import autopar
from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from autopar.estimate.plan_cost import PlanEstimate, estimate_plan
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import ModelRef, Plan
from autopar.search.baselines import baselines
from autopar.search.homogeneous import ConfigResult, HomogeneousSearch, nothing_fits_error
from autopar.search.options import SearchOptions
from autopar.search.rules import rule_counts


@dataclass
class SearchResult:
    plan: Plan
    estimate: PlanEstimate
    seconds: float
    candidates: int
    pruned: dict[str, int]
    configs: list[ConfigResult] = field(default_factory=list)
    timed_out: bool = False
    baselines: dict[str, tuple[Plan, PlanEstimate] | None] = field(default_factory=dict)
    planner: str = "homogeneous"


def search(model: ModelSpec, cluster: Cluster, global_batch_size: int, opts: SearchOptions | None = None,
           with_baselines: bool = True) -> SearchResult:
    """The fastest plan under the cost model that fits, with its estimate and the baselines.

    Raises AutoparError (naming the closest setting) when nothing fits.
    """
    opts = opts or SearchOptions()
    if not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise AutoparError("global_batch_size", f"must be a positive integer, got {global_batch_size!r}",
                           "pass --global-batch-size N with N >= 1")
    if not cluster.is_homogeneous:
        from autopar.search.hetero import search_heterogeneous

        return search_heterogeneous(model, cluster, global_batch_size, opts, with_baselines)
    start = time.perf_counter()
    hs = HomogeneousSearch(model, cluster, global_batch_size, opts)
    best, results = hs.run()
    seconds = time.perf_counter() - start
    if best is None:
        raise nothing_fits_error(results, cluster, opts)
    plan = Plan(ModelRef(model.name, model.seq_len, model.num_layers, model.source), cluster, global_batch_size,
                [hs.pipeline_of(best)], schedule=opts.schedule, memory_budget_gib=opts.memory_budget_gib)
    est = estimate_plan(plan, model, opts.params)
    if abs(est.step_time_s - best.step_time) > 1e-9 * best.step_time:
        raise RuntimeError(f"internal: search optimised {best.step_time!r} but the plan estimates "
                           f"{est.step_time_s!r}; the search and estimate_plan disagree")
    plan.predicted = est.predicted()
    plan.search = {
        "autopar_version": autopar.__version__,
        "planner": "homogeneous",
        "seconds": round(seconds, 4),
        "candidates": int(hs.candidates),
        "configs": len(results),
        "pruned": rule_counts(hs.pruned),
        "timed_out": hs.timed_out,
        "cost_params": opts.params.to_dict(),
    }
    base = baselines(model, cluster, global_batch_size, opts) if with_baselines else {}
    return SearchResult(plan, est, seconds, hs.candidates, rule_counts(hs.pruned), results, hs.timed_out, base)
