"""Search on a homogeneous cluster: PP degree and micro-batching, then per-layer strategies and the
pipeline partition jointly (Galvatron-BMW's space, solved exactly under the cost model).

Order of the decision tree: (1) PP degree p (stages of N/p devices, kept inside or across whole
nodes), (2) micro-batch count m, (3) per layer (tp, zero, ckpt, sp) under the stage's memory by the
frontier DP, (4) the partition by ``best_partition`` (which minimises the closed form), whose plan is
then priced by ``estimate_pipeline``: its schedule table simulated, the number every plan is chosen by.
Configurations (p, m) are visited in order of a proven lower bound on that simulated step time
(``cost_models.pipeline.pipeline_lower_bound``) and the loop stops when the bound passes the best plan
found.

``search_homogeneous`` is the planner's entry: the plan, its estimate (checked equal to the figure
the search optimised) and the baselines, as a ``SearchResult``.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from autopar.cluster.cluster import GIB, Cluster
from autopar.errors import AutoparError, NoFitError
from autopar.estimate import (
    CostCache,
    StageContext,
    device_budget_bytes,
    estimate_plan,
    layout_switch_time,
    stage_link,
)
from autopar.estimate.context import tie_partner
from autopar.estimate.pipeline import estimate_pipeline
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer
from autopar.search.baselines import baselines
from autopar.search.frontier import RangeTrie
from autopar.search.interleave import try_interleaving
from autopar.search.options import SearchOptions, nothing_fits_fix
from autopar.search.partition import best_partition, minmax_partition
from autopar.search.progress import progress_bar
from autopar.search.result import HOMOGENEOUS, ConfigResult, SearchResult
from autopar.search.rules import Rule, rule_counts
from autopar.search.space import divisors, layer_candidates, tp_degrees
from autopar.search.zero_bubble import try_zero_bubble
from autopar.version import __version__
from cost_models.memory import inflight_microbatches
from cost_models.pipeline import boundary_p2p_time, pipeline_lower_bound

REPRICED = 4  # partitions of one setting priced by simulation: the closed form's best and its runners-up


def layer_signatures(model: ModelSpec) -> list[int]:
    """Equal ids for layers that differ only by name (repeated transformer blocks)."""
    ids: dict = {}
    return [ids.setdefault(replace(ly, name=""), len(ids)) for ly in model.layers]


@dataclass
class HomogeneousSearch:
    """State of one search; ``run`` returns the best pipeline and the per-config results."""

    model: ModelSpec
    cluster: Cluster
    global_batch_size: int
    opts: SearchOptions
    pruned: Counter = field(default_factory=Counter)
    candidates: int = 0
    timed_out: bool = False
    deadline: float | None = None  # time.perf_counter() past which the time budget is spent (set by run)
    cache: CostCache = field(default_factory=CostCache)  # per-layer costs of the plans the search prices

    def __post_init__(self) -> None:
        self.sigs = layer_signatures(self.model)
        self.sig_layer = {s: self.model.layers[i] for i, s in enumerate(self.sigs)}

    # -- the decision tree's first two levels -------------------------------------------------
    def configs(self) -> list[tuple[int, int]]:
        N, L = self.cluster.num_devices, self.model.num_layers
        G = self.cluster.gpus_per_node
        out = []
        pps = self.opts.pp_degrees or divisors(N)
        for p in pps:
            if N % p or p > L:
                self.pruned[Rule.PP_MORE_STAGES_THAN_LAYERS if p > L else Rule.PP_NOT_DIVIDING_DEVICES] += 1
                continue
            n = N // p
            if n % G and G % n:
                self.pruned[Rule.PP_STAGE_STRADDLES_NODE] += 1
                continue
            for m in divisors(self.global_batch_size):
                if self.opts.num_microbatches and m not in self.opts.num_microbatches:
                    continue
                out.append((p, m))
        return out

    def stage_devices(self, p: int, i: int) -> list[int]:
        n = self.cluster.num_devices // p
        return list(range(i * n, (i + 1) * n))

    def context(self, p: int, m: int) -> StageContext:
        """The first stage's context, every layer's candidates priced in it (the stages are alike); it names the
        last stage as the other holder of a tied tensor (``pipeline_contexts``), so tied embeddings' copy and
        sync are priced where the plan's estimate prices them."""
        mbs = self.global_batch_size // m
        partner = tie_partner(0, p)
        tie = () if partner is None else tuple(self.stage_devices(p, partner))
        return StageContext(self.cluster, tuple(self.stage_devices(p, 0)), mbs, m, self.opts.params, self.opts.cp,
                            tie_devices=tie)

    # -- one configuration --------------------------------------------------------------------
    def candidates_for(self, p: int, m: int):
        ctx = self.context(p, m)
        tps = tp_degrees(ctx, self.pruned, self.opts.max_tp)
        layouts: dict = {}
        cands = {s: layer_candidates(ly, ctx, tps, layouts, self.pruned, prune=self.opts.prune_dominated)
                 for s, ly in self.sig_layer.items()}
        return ctx, cands, layouts

    def lower_bound(self, p: int, m: int, cands) -> float:
        """A lower bound of the simulated step time of any plan of setting (p, m), memory ignored:
        ``pipeline_lower_bound`` of C, W the sums of per-layer least costs ``w + s / m`` and least
        forward + backward ``w`` (layout switches and sends only add), and the largest forward share
        of any layer's strategy (a stage's is a mediant of its layers')."""
        tot = work = share = 0.0
        for s in self.sigs:
            c = cands[s].costs
            if len(c.cost) == 0:
                return float("inf")
            tot += float(c.cost.min())
            work += float((c.fwd + c.bwd).min())
            with np.errstate(invalid="ignore", divide="ignore"):
                share = max(share, float(np.nan_to_num(c.fwd / (c.fwd + c.bwd), nan=1.0).max()))
        return pipeline_lower_bound(work, tot, p, m, self.opts.params.slot_overhead_s, fwd_share=share,
                                    schedule=self.opts.schedule)

    def _ranges(self, k: int, cands, switch, budget: float, reserve: float, transient: np.ndarray, m: int,
                incumbent: float):
        """(C, S, trie, range -> trie node, least memory) of every layer range [a, b) on a stage holding ``k``
        micro-batches in flight; None when the time budget ran out with a plan in hand (checked per start a)."""
        L = self.model.num_layers
        trie = RangeTrie(cands, switch, k, budget - reserve)
        C = np.full((L + 1, L + 1), np.inf)
        S = np.zeros((L + 1, L + 1))  # the step tail of C's strategies
        Mmin = np.full((L + 1, L + 1), np.inf)
        node_of = {}
        memo: dict[int, tuple[float, int]] = {}
        least = np.array([float(cands[s].costs.mem(k).min()) if len(cands[s].strategies) else np.inf
                          for s in self.sigs])
        # Stage i runs some range [a, b) with i <= a and b <= L - (p - 1 - i); extending a range
        # never lowers its cost or memory, so stop once it cannot fit or cannot beat the incumbent.
        for a in range(L):
            if np.isfinite(incumbent) and self.over_budget():
                return None
            Mmin[a, a + 1:] = (np.cumsum(least[a:]) + np.maximum.accumulate(transient[a:])) + reserve
            node, tmax = -1, 0.0
            for b in range(a + 1, L + 1):
                tmax = max(tmax, transient[b - 1])
                if Mmin[a, b] > budget:
                    self.pruned[Rule.RANGE_OVER_MEMORY] += L + 1 - b
                    break
                node = trie.child(node, self.sigs[b - 1])
                if node not in memo:
                    memo[node] = trie.best(node, budget - reserve - tmax)
                C[a, b] = memo[node][0]
                S[a, b] = trie.step(node, memo[node][1])
                node_of[(a, b)] = node
                if m * C[a, b] >= incumbent:  # T >= m w + s = m C of any one stage
                    self.pruned[Rule.RANGE_OVER_INCUMBENT] += L - b
                    break
        self.candidates += trie.points_examined
        return C, S, trie, node_of, Mmin

    @staticmethod
    def _stand_in(*by_k: dict) -> tuple:
        """The ranges of the fewest micro-batches in flight computed so far (each dict keyed by that count)."""
        k = min(by_k[0])
        return tuple(d[k] for d in by_k)

    def _cut(self, res: ConfigResult) -> ConfigResult:
        """``res`` left without a plan because the time budget ran out part-way through it."""
        self.timed_out = True
        res.note = "time budget: not finished"
        return res

    def evaluate(self, p: int, m: int, ctx: StageContext, cands, layouts, lower_bound: float,
                 incumbent: float = float("inf"), exact: bool = False, inflight: list[float] | None = None,
                 ) -> ConfigResult:
        """The best plan of setting (p, m) that beats ``incumbent``, or a result saying why there is none.

        ``inflight``: micro-batches each stage holds at its peak (default: the schedule's count); the
        interleaved re-cut (interleave.py) passes its table's, in stages' worth.

        Past the time budget (checked per in-flight count and per range start) the setting is dropped
        when a plan is in hand; with none yet (an answer beats none) the in-flight counts not reached
        use stand-in ranges, unless ``exact``.
        """
        L, mbs = self.model.num_layers, ctx.micro_batch_size
        res = ConfigResult(p, m, mbs, lower_bound)
        switch = self.switch_costs(ctx, layouts)
        budget = device_budget_bytes(self.cluster, ctx.devices[0], self.opts.memory_budget_gib)
        reserve = self.opts.params.reserve_bytes
        transient = np.array([cands[s].transient for s in self.sigs])
        ks = inflight or [inflight_microbatches(self.opts.schedule, p, i, m) for i in range(p)]
        C_by_k, S_by_k, trie_by_k, nodes_by_k, M_by_k = {}, {}, {}, {}, {}
        stand_in = False
        for k in sorted(set(ks), reverse=True):  # most in flight first: see the stand-in below
            if C_by_k and not exact and self.over_budget():
                if np.isfinite(incumbent):  # a plan is in hand: drop this setting
                    return self._cut(res)
                # No plan yet, and an answer beats none: fewer micro-batches in flight need no more
                # memory, so the ranges of the fewest in flight so far (all > k) fit stages holding k
                # too; their times are exact, only perhaps not the fastest for k.
                stand_in = self.timed_out = True
            if stand_in:
                ranges = self._stand_in(C_by_k, S_by_k, trie_by_k, nodes_by_k, M_by_k)
            else:
                ranges = self._ranges(k, cands, switch, budget, reserve, transient, m, incumbent)
                if ranges is None:
                    return self._cut(res)
            C_by_k[k], S_by_k[k], trie_by_k[k], nodes_by_k[k], M_by_k[k] = ranges
        res.min_memory_gib = minmax_partition([M_by_k[k] for k in ks])[0] / GIB
        P = []
        for i in range(p):
            Pi = np.zeros(L + 1)
            if i + 1 < p:
                bw, lat = stage_link(self.cluster, self.stage_devices(p, i), self.stage_devices(p, i + 1))
                bb = np.array([0.0] + [ly.boundary_bytes for ly in self.model.layers])
                Pi = 2.0 * boundary_p2p_time(bb, mbs, bw, lat)
                Pi[0] = 0.0
            P.append(Pi)
        part = best_partition([C_by_k[k] for k in ks], P, m, self.opts.params.slot_overhead_s, [S_by_k[k] for k in ks])
        if part is None:
            if stand_in:  # the stand-ins leave no partition: the exact ranges decide (no false "nothing fits")
                return self.evaluate(p, m, ctx, cands, layouts, lower_bound, incumbent, exact=True, inflight=inflight)
            fits = res.min_memory_gib * GIB <= budget
            res.note = "cannot beat the best plan" if fits else f"needs {res.min_memory_gib:.3g} GiB per device"
            return res
        # Each partition the closed form ranked best (and up to REPRICED - 1 runners-up) priced as
        # estimate_plan prices it, by the very code (the table simulated): the fastest is the setting's plan.
        for bounds in part.candidates(REPRICED):
            stages = []
            for i in range(p):
                a, b = bounds[i], bounds[i + 1]
                node = nodes_by_k[ks[i]][(a, b)]
                trie = trie_by_k[ks[i]]
                _, point = trie.best(node, budget - reserve - max(transient[a:b]))
                picks = trie.trace(node, point)
                layers = [StageLayer(self.model.layers[j].name, cands[self.sigs[j]].strategies[picks[j - a]])
                          for j in range(a, b)]
                stages.append(Stage(self.stage_devices(p, i), layers))
            pipe = Pipeline(self.global_batch_size, mbs, m, stages)
            t = estimate_pipeline(pipe, self.model, self.cluster, self.opts.schedule, self.opts.params, self.cache)[1]
            if not res.stages or t < res.step_time:
                res.step_time, res.stages = t, stages
        return res

    def switch_costs(self, ctx: StageContext, layouts: dict) -> dict[int, np.ndarray]:
        """Per layer signature, the layout-switch time after it from each layout to each layout."""
        layout_list = sorted(layouts, key=layouts.get)
        switch = {}
        for s, ly in self.sig_layer.items():
            sw = np.zeros((len(layout_list), len(layout_list)))
            for a, la in enumerate(layout_list):
                for b, lb in enumerate(layout_list):
                    sw[a, b] = layout_switch_time(ly.boundary_bytes, la, lb, ctx)
            switch[s] = sw
        return switch

    # -- the loop --------------------------------------------------------------------------
    def over_budget(self) -> bool:
        """Past the deadline (``run`` sets it from the time budget)."""
        return self.deadline is not None and time.perf_counter() > self.deadline

    def run(self) -> tuple[ConfigResult | None, list[ConfigResult]]:
        """The best configuration and every visited one. The time budget covers scoring too: past it,
        the configurations scored so far are searched (the rest only while none of them gave a plan).
        It is checked inside a setting as well (``evaluate``), so the overrun is a fraction of a setting."""
        start = time.perf_counter()
        self.deadline = start + self.opts.time_budget_s if self.opts.time_budget_s is not None else None
        pending = self.configs()
        best: ConfigResult | None = None
        results: list[ConfigResult] = []
        while pending and best is None:
            scored = []
            while pending and not (scored and self.over_budget()):
                p, m = pending.pop(0)
                ctx, cands, layouts = self.candidates_for(p, m)
                scored.append((self.lower_bound(p, m, cands), p, m, ctx, cands, layouts))
            self.timed_out = self.timed_out or bool(pending)
            best = self.search_scored(scored, best, results)
        return best, results

    def search_scored(self, scored: list, best: ConfigResult | None,
                      results: list[ConfigResult]) -> ConfigResult | None:
        """Evaluate scored configurations in order of their bound; returns the best plan so far."""
        scored.sort(key=lambda x: x[0])
        bar = progress_bar(len(scored), self.opts.progress, "configs", "cfg")
        for lb, p, m, ctx, cands, layouts in scored:
            if best is not None and lb >= best.step_time:
                self.pruned[Rule.CONFIG_LOWER_BOUND] += 1
                results.append(ConfigResult(p, m, ctx.micro_batch_size, lb, note="bound >= best"))
                bar.update(1)
                continue
            if not np.isfinite(lb):
                self.pruned[Rule.CONFIG_NO_STRATEGY] += 1
                results.append(ConfigResult(p, m, ctx.micro_batch_size, lb, note="no legal strategy"))
                bar.update(1)
                continue
            # The budget stops the search only once it has a plan: an answer beats none.
            if best is not None and self.over_budget():
                self.timed_out = True
                break
            r = self.evaluate(p, m, ctx, cands, layouts, lb, best.step_time if best else float("inf"))
            results.append(r)
            if r.stages and (best is None or r.step_time < best.step_time):
                best = r
            bar.update(1)
        bar.close()
        return best

    def pipeline_of(self, r: ConfigResult) -> Pipeline:
        return Pipeline(self.global_batch_size, r.micro_batch_size, r.num_microbatches, r.stages,
                        virtual_stages=r.virtual_stages)


def search_homogeneous(model: ModelSpec, cluster: Cluster, global_batch_size: int, opts: SearchOptions,
                       with_baselines: bool = True) -> SearchResult:
    """The fastest plan under the cost model that fits ``cluster`` (homogeneous), with its estimate
    and, when asked, the DDP / ZeRO-3 / Megatron baselines.

    The estimate is ``estimate_plan`` of the returned plan and equals the step time the search
    optimised (to 1e-9, else RuntimeError). Raises AutoparError (naming the closest setting) when
    nothing fits.
    """
    start = time.perf_counter()
    hs = HomogeneousSearch(model, cluster, global_batch_size, opts)
    best, results = hs.run()
    interleaved = try_interleaving(hs, results) + try_zero_bubble(hs, results)
    results += interleaved
    for r in interleaved:
        if r.stages and (best is None or r.step_time < best.step_time):
            best = r
    seconds = time.perf_counter() - start
    if best is None:
        raise nothing_fits_error(results, cluster, opts)
    schedule = best.schedule or ("interleaved" if best.virtual_stages > 1 else opts.schedule)
    plan = Plan(ModelRef(model.name, model.seq_len, model.num_layers, model.source), cluster, global_batch_size,
                [hs.pipeline_of(best)], schedule=schedule, memory_budget_gib=opts.memory_budget_gib)
    est = estimate_plan(plan, model, opts.params)
    if abs(est.step_time_s - best.step_time) > 1e-9 * best.step_time:
        raise RuntimeError(f"internal: search optimised {best.step_time!r} but the plan estimates "
                           f"{est.step_time_s!r}; the search and estimate_plan disagree")
    plan.predicted = est.predicted()
    pruned = rule_counts(hs.pruned)
    plan.search = {
        "autopar_version": __version__,
        "planner": HOMOGENEOUS,
        "seconds": round(seconds, 4),
        **({"max_tp": opts.max_tp} if opts.max_tp is not None else {}),
        "candidates": int(hs.candidates),
        "configs": len(results),
        "pruned": pruned,
        "timed_out": hs.timed_out,
        "cost_params": opts.params.to_dict(),
    }
    deadline = start + opts.time_budget_s if opts.time_budget_s is not None else None
    base_start = time.perf_counter()
    base = baselines(model, cluster, global_batch_size, opts, deadline=deadline) if with_baselines else {}
    return SearchResult(HOMOGENEOUS, plan, est, seconds, hs.candidates, dict(pruned), results, hs.timed_out, base,
                        baseline_seconds=time.perf_counter() - base_start if with_baselines else 0.0)


def nothing_fits_error(results: list[ConfigResult], cluster: Cluster, opts: SearchOptions) -> AutoparError:
    """The one-line 'no plan fits' error naming the closest setting and what it needs."""
    tried = [r for r in results if np.isfinite(r.min_memory_gib)]
    budget = min(cluster.budget_gib(nd_first, opts.memory_budget_gib) for nd_first in cluster.first_devices())
    if not tried:
        return AutoparError("global_batch_size", "no (pp, micro-batch) setting gives every layer a legal strategy",
                            "pick a global batch size divisible by the data-parallel degrees (e.g. a power of 2)")
    c = min(tried, key=lambda r: r.min_memory_gib)
    cp = f"cp={opts.cp}, " if opts.cp > 1 else ""
    return NoFitError(
        f"no plan fits in {budget:.3g} GiB per device; the closest, {cp}pp={c.pp} with "
        f"{c.num_microbatches} micro-batches of {c.micro_batch_size}, needs {c.min_memory_gib:.3g} GiB per device",
        nothing_fits_fix(opts, cluster.memory_margin), need_gib=c.min_memory_gib)
