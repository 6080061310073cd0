"""Interleaved schedules in the homogeneous search: the best 1F1B settings re-cut into virtual stages.

For each of the best few (pp, m) settings the 1F1B search found (``TRIED`` of them, pp >= 2, m a
multiple of pp) and each v of ``SearchOptions.virtual_stages`` (2 and 4 by default) with at least one
unit per chunk, the units are cut into p * v consecutive chunks of near-equal cost under the 1F1B
strategies (chunk k on stage k mod p, Megatron's layout); then the frontier DP picks each physical stage's per-layer strategies again over
the units of its chunks, holding that stage's in-flight activations of the interleaved table
(``stage_equivalents``), within the device budget. Each candidate is priced by ``estimate_plan``, i.e.
by the table the runtime executes (bubble, in-flight activations per chunk, the p2p of every chunk
boundary), and kept only when it fits. The cut is fixed before the strategies, so this is a heuristic
step on top of the exact 1F1B search, recorded per candidate (``ConfigResult.virtual_stages``) for
``--explain``.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from autopar.cluster.cluster import Cluster
from autopar.estimate import CostCache, StageContext, device_budget_bytes, estimate_plan, stage_cost
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from autopar.search.frontier import RangeTrie
from autopar.search.options import SearchOptions
from autopar.search.result import ConfigResult
from cost_models.pipeline_schedules import peak_inflight, schedule_table

TRIED = 3  # best 1F1B settings re-cut


def balanced_cuts(costs: list[float], parts: int) -> list[int]:
    """Bounds of ``parts`` non-empty consecutive runs of ``costs`` whose largest sum is (near) least:
    the least feasible threshold by bisection, a greedy cut at it, then the longest runs split until
    there are ``parts`` (splitting never raises the largest sum)."""
    n = len(costs)
    assert 1 <= parts <= n

    def greedy(tau: float) -> list[int] | None:
        cuts, run = [0], 0.0
        for i, c in enumerate(costs):
            if run + c > tau and i > cuts[-1]:
                cuts.append(i)
                run = 0.0
            run += c
        cuts.append(n)
        return cuts if len(cuts) - 1 <= parts else None

    lo, hi = max(costs), sum(costs)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if greedy(mid) is not None else (mid, hi)
    cuts = greedy(hi) or [0, n]
    while len(cuts) - 1 < parts:
        k = max(range(len(cuts) - 1), key=lambda j: cuts[j + 1] - cuts[j])
        cuts.insert(k + 1, (cuts[k] + cuts[k + 1]) // 2)
    return cuts


def interleaved_pipeline(stages: list[Stage], costs: list[float], v: int) -> list[Stage]:
    """The units of ``stages`` (with their strategies) cut into len(stages) * v chunks, chunk k on the
    devices of ``stages[k % p]``; ``costs``: per unit, what balances the chunks."""
    p = len(stages)
    units: list[StageLayer] = [ly for st in stages for ly in st.layers]
    cuts = balanced_cuts(costs, p * v)
    return [Stage(list(stages[k % p].devices), units[cuts[k]:cuts[k + 1]]) for k in range(p * v)]


class Search(Protocol):
    """What the re-cut needs of ``homogeneous.HomogeneousSearch`` (which imports this module)."""

    model: ModelSpec
    cluster: Cluster
    global_batch_size: int
    opts: SearchOptions
    sigs: list[int]
    pruned: Counter

    def over_budget(self) -> bool: ...

    def candidates_for(self, p: int, m: int) -> tuple: ...

    def switch_costs(self, ctx: StageContext, layouts: dict) -> dict: ...

    def evaluate(self, p: int, m: int, ctx: StageContext, cands, layouts, lower_bound: float,
                 incumbent: float = float("inf"), exact: bool = False, inflight: list | None = None,
                 ) -> ConfigResult: ...


def stage_equivalents(p: int, m: int, v: int) -> list[float]:
    """Per stage, its peak in-flight micro-batch chunks in the interleaved table, in stages' worth (/ v):
    the activations the frontier DP budgets for when it picks a physical stage's strategies."""
    table = schedule_table("interleaved", p, m, v)
    return [sum(peak_inflight(slots, [1.0] * v)) / v for slots in table]


def _stage_strategies(hs: Search, ctx: StageContext, cands, switch, units: list[int], inflight: float,
                      tries: dict) -> list[Strategy] | None:
    """The frontier DP's fastest strategies for the units (model indices, in the order the stage runs them)
    of one physical stage holding ``inflight`` micro-batches, within the device budget; None if none fits."""
    budget = device_budget_bytes(hs.cluster, ctx.devices[0], hs.opts.memory_budget_gib)
    reserve = hs.opts.params.reserve_bytes
    if inflight not in tries:
        tries[inflight] = RangeTrie(cands, switch, inflight, budget - reserve)
    trie = tries[inflight]
    node = -1
    for j in units:
        node = trie.child(node, hs.sigs[j])
    tmax = max(cands[hs.sigs[j]].transient for j in units)
    _, point = trie.best(node, budget - reserve - tmax)
    if point < 0:
        return None
    picks = trie.trace(node, point)
    return [cands[hs.sigs[j]].strategies[i] for j, i in zip(units, picks)]


def try_interleaving(hs: Search, results: list[ConfigResult]) -> list[ConfigResult]:
    """Interleaved candidates of the best settings in ``results`` (see the module), each with its step time
    and chunks when it fits, else a note. Stops once the search's time budget is spent."""
    model, cluster, gbs, opts = hs.model, hs.cluster, hs.global_batch_size, hs.opts
    if opts.schedule != "1f1b":
        return []
    cache = CostCache()
    ref = ModelRef(model.name, model.seq_len, model.num_layers, model.source)
    index = model.index()
    out: list[ConfigResult] = []
    base = sorted((r for r in results if r.stages and r.virtual_stages == 1 and r.pp >= 2
                   and r.num_microbatches % r.pp == 0), key=lambda r: r.step_time)
    for r in base[:TRIED]:
        p, m, mbs = r.pp, r.num_microbatches, r.micro_batch_size
        counted = Counter(hs.pruned)  # the setting's candidates were pruned (and counted) once already
        ctx, cands, layouts = hs.candidates_for(p, m)
        hs.pruned = counted
        switch, tries = hs.switch_costs(ctx, layouts), {}
        costs = [stage_cost([model.layers[index[ly.name]]], [ly.strategy], ctx, 0, cache).cost
                 for st in r.stages for ly in st.layers]
        for v in opts.virtual_stages:
            if p * v > model.num_layers or hs.over_budget():
                break
            res = ConfigResult(p, m, mbs, r.lower_bound, virtual_stages=v)
            out.append(res)
            chunks = interleaved_pipeline(r.stages, costs, v)
            cuts = [0]
            for st in chunks:
                cuts.append(cuts[-1] + len(st.layers))
            strategies: dict[int, Strategy] = {}
            for s, k in enumerate(stage_equivalents(p, m, v)):
                units = [j for g in range(s, p * v, p) for j in range(cuts[g], cuts[g + 1])]
                picked = _stage_strategies(hs, ctx, cands, switch, units, k, tries)
                if picked is None:
                    res.note = f"stage {s}'s units fit no strategies with {k:.3g} micro-batches in flight"
                    break
                strategies.update(zip(units, picked))
            if res.note:
                continue
            chunks = [Stage(st.devices, [StageLayer(ly.name, strategies[cuts[g] + i]) for i, ly in enumerate(st.layers)])
                      for g, st in enumerate(chunks)]
            plan = Plan(ref, cluster, gbs, [Pipeline(gbs, mbs, m, chunks, virtual_stages=v)],
                        schedule="interleaved", memory_budget_gib=opts.memory_budget_gib)
            est = estimate_plan(plan, model, opts.params, cache)
            if est.fits:
                res.step_time, res.stages = est.step_time_s, chunks
            else:
                res.note = f"re-cut needs {est.max_memory_gib:.3g} GiB per device"
    return out
