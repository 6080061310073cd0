"""The zero-bubble schedule (``zb-h1``) in the homogeneous search: the best 1F1B settings re-run under it.

For each of the best few (pp, m) settings the 1F1B search found (``TRIED`` of them, pp >= 2), the
same stages and strategies are priced under ``zb-h1`` by ``estimate_plan`` (the table the runtime
executes, backward split into B and W). Under zb-h1 every stage holds min(p, m) micro-batches'
activations (1F1B's stage s holds min(p - s, m)), and the split backward cannot run ZeRO-3 or op-level
checkpointing (``plan.rules.zero_bubble_rules``), so the 1F1B plan may not carry over: then the frontier
DP picks strategies and partition again, holding zb-h1's in-flight counts (``evaluate(inflight=...)``)
over the setting's candidates less those two options (a heuristic: strategies the dominance pruning
dropped in favour of a ZeRO-3 one are not brought back), and that plan is priced the same way. A
candidate is kept only when it fits; the search keeps it over the 1F1B plan only when it is faster.
Each candidate is recorded (``ConfigResult.schedule``) for ``--explain``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from autopar.estimate import CostCache, estimate_plan
from autopar.estimate.zero_bubble import SCHEDULE, zero_bubble_inflight
from autopar.plan.rules import zero_bubble_rules
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage
from autopar.search.interleave import Search
from autopar.search.result import ConfigResult
from autopar.search.space import LayerCandidates
from cost_models.layer import LayerCosts

TRIED = 3  # best 1F1B settings re-run under zb-h1


def _priced(hs: Search, r: ConfigResult, stages: list[Stage], cache: CostCache) -> tuple[float, str]:
    """(step time, "") of ``stages`` under zb-h1 when the plan runs and fits, else (inf, why not)."""
    model = hs.model
    plan = Plan(ModelRef(model.name, model.seq_len, model.num_layers, model.source), hs.cluster,
                hs.global_batch_size, [Pipeline(hs.global_batch_size, r.micro_batch_size, r.num_microbatches, stages)],
                schedule=SCHEDULE, memory_budget_gib=hs.opts.memory_budget_gib)
    problem = next(iter(zero_bubble_rules(plan)), None)
    if problem is not None:
        return float("inf"), problem[1]
    est = estimate_plan(plan, model, hs.opts.params, cache)
    if not est.fits:
        return float("inf"), f"zb-h1 needs {est.max_memory_gib:.3g} GiB per device"
    return est.step_time_s, ""


def runnable_candidates(cands: dict[int, LayerCandidates]) -> dict[int, LayerCandidates] | None:
    """Per layer signature, its candidates without ZeRO-3 and op-level checkpointing (what zb-h1 cannot
    run); None when some signature keeps none."""
    out = {}
    for sig, c in cands.items():
        keep = np.array([i for i, s in enumerate(c.strategies) if s.zero != 3 and s.ckpt != "op"], dtype=int)
        if len(keep) == 0:
            return None
        costs = LayerCosts(*(getattr(c.costs, f)[keep] for f in ("fwd", "bwd", "step", "cost", "mem_states", "mem_act")))
        out[sig] = LayerCandidates([c.strategies[i] for i in keep], costs, c.layouts[keep], c.transient)
    return out


def try_zero_bubble(hs: Search, results: list[ConfigResult]) -> list[ConfigResult]:
    """zb-h1 candidates of the best 1F1B settings in ``results`` (see the module), each with its step time
    and stages when one fits, else a note. Stops once the search's time budget is spent."""
    if hs.opts.schedule != "1f1b" or not hs.opts.zero_bubble:
        return []
    cache = CostCache()
    out: list[ConfigResult] = []
    base = sorted((r for r in results if r.stages and r.virtual_stages == 1 and r.pp >= 2 and not r.schedule),
                  key=lambda r: r.step_time)
    for r in base[:TRIED]:
        if hs.over_budget():
            break
        p, m = r.pp, r.num_microbatches
        res = ConfigResult(p, m, r.micro_batch_size, r.lower_bound, schedule=SCHEDULE)
        out.append(res)
        t, note = _priced(hs, r, r.stages, cache)
        if t == float("inf"):  # the 1F1B plan does not carry over (see the module): pick again
            counted = Counter(hs.pruned)  # the setting's candidates were pruned (and counted) once already
            ctx, cands, layouts = hs.candidates_for(p, m)
            hs.pruned = counted
            cands = runnable_candidates(cands)
            if cands is None:
                res.note = f"{note}; some unit has no strategy without zero 3 or ckpt op"
                continue
            again = hs.evaluate(p, m, ctx, cands, layouts, r.lower_bound, inflight=zero_bubble_inflight(p, m))
            if again.stages:
                t2, note2 = _priced(hs, r, again.stages, cache)
                if t2 < t:
                    t, note, r = t2, note2, again
            elif again.note:
                note = f"{note}; with its in-flight activations: {again.note}"
        if t < float("inf"):
            res.step_time, res.stages = t, r.stages
        else:
            res.note = note
    return out
