"""A shape (devices grouped into ordered stages of pipelines) made into a scored Plan.

Per pipeline the layer split and strategies come from ``LayerSplitter``; shares start in proportion
to each pipeline's peak compute, then ``allocate`` rebalances them by the pipelines' actual times and
every pipeline whose micro-batch count changed is split again at its new batching. The score is
``estimate_plan(plan).step_time_s``: the very number the search reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from autopar.estimate import (
    CostCache,
    PlanEstimate,
    boundary_p2p_time,
    estimate_plan,
    stage_cost,
)
from autopar.estimate.context import pipeline_contexts
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import ModelRef, Pipeline, Plan
from autopar.search.hetero.batch_shares import PipelineRate, allocate, proportional
from autopar.search.hetero.graph_partition import Shape, canonical
from autopar.search.hetero.layer_split import LayerSplitter, PipelineSplit
from autopar.search.options import SearchOptions
from cost_models.memory import inflight_microbatches


def node_classes(cluster: Cluster) -> list[int]:
    """Per node, the first node interchangeable with it: same GPU type, count and fabric, and the same
    link to every other node (so swapping them maps the cluster onto itself)."""
    n = cluster.num_nodes
    out = list(range(n))
    for b in range(n):
        for a in range(b):
            if out[a] != a:
                continue
            na, nb = cluster.nodes[a], cluster.nodes[b]
            if (na.gpu, na.count, na.intra_bw, na.intra_lat_us) != (nb.gpu, nb.count, nb.intra_bw, nb.intra_lat_us):
                continue
            if all(cluster.node_link(a, c) == cluster.node_link(b, c) for c in range(n) if c not in (a, b)):
                out[b] = a
                break
    return out


@dataclass
class Candidate:
    shape: Shape
    plan: Plan
    estimate: PlanEstimate

    @property
    def time(self) -> float:
        return self.estimate.step_time_s


def model_ref(model: ModelSpec) -> ModelRef:
    return ModelRef(model.name, model.seq_len, model.num_layers, model.source)


class Realiser:
    """Shapes to scored plans, memoised (local search revisits shapes)."""

    def __init__(self, model: ModelSpec, cluster: Cluster, global_batch_size: int, opts: SearchOptions,
                 splitter: LayerSplitter, tries: int = 1, resplit: bool = False, cache: CostCache | None = None):
        self.model, self.cluster, self.B, self.opts, self.splitter = model, cluster, global_batch_size, opts, splitter
        self.costs = cache if cache is not None else CostCache()  # the cost model's memo (shared by the caller)
        self.tries = tries  # micro-batch sizes solved per pipeline (best guesses first)
        self.resplit = resplit  # split pipelines again after the shares moved (else keep their strategies)
        self.cache: dict[Shape, Candidate | None] = {}
        self._rates: dict = {}
        self._alloc: dict = {}
        self._by_signature: dict = {}
        self.node_class = node_classes(cluster)
        self.evaluated = 0

    def __call__(self, shape: Shape) -> Candidate | None:
        key = canonical(shape)
        if key in self.cache:
            return self.cache[key]
        sig = self.signature(key)
        if sig in self._by_signature:  # a relabelling of a shape already scored: same cost
            cand = self._by_signature[sig]
        else:
            try:
                cand = self._realise(key)
            except AutoparError:
                cand = None
            self._by_signature[sig] = cand
            self.evaluated += 1
        self.cache[key] = cand
        return cand

    def signature(self, shape: Shape) -> tuple:
        """Equal for shapes that are the same up to swapping interchangeable nodes and the devices
        inside a node: per stage its kind and its node, nodes renamed by first appearance in their
        class (node_classes: nodes with equal GPUs and equal links to every other node)."""
        names: dict[int, tuple[int, int]] = {}
        count: dict[int, int] = {}
        out = []
        for pipe in shape:
            stages = []
            for st in pipe:
                nodes = []
                for d in st:
                    n = self.cluster.node_of(d)
                    if n not in names:
                        cls = self.node_class[n]
                        names[n] = (cls, count.get(cls, 0))
                        count[cls] = count.get(cls, 0) + 1
                    nodes.append(names[n])
                stages.append((self.splitter.kind(st), tuple(nodes)))
            out.append(tuple(stages))
        return tuple(out)

    def _realise(self, shape: Shape) -> Candidate | None:
        if len(shape) > self.B:
            return None
        if len(shape) == 1:
            sp = self.splitter.best(list(shape[0]), self.B, self.tries)
            return None if sp is None else self.score(shape, [sp])
        weights = [sum(self.cluster.gpu_of(d).tflops for st in p for d in st) for p in shape]
        shares = proportional(self.B, weights, [1] * len(shape))
        if not shares:
            return None
        nominal = [self.splitter.best(list(p), b, self.tries) for p, b in zip(shape, shares)]
        if any(sp is None for sp in nominal):
            return None
        akey = tuple(sp.key for sp in nominal)
        if akey not in self._alloc:
            self._alloc[akey] = allocate(self.B, [self.rate(sp) for sp in nominal])
        ms = self._alloc[akey]
        if ms is None or all(m == sp.num_microbatches for m, sp in zip(ms, nominal)):
            return self.score(shape, nominal)
        pipes = []
        for sp, m in zip(nominal, ms):
            if m == sp.num_microbatches:
                pipes.append(sp)
                continue
            again = self.splitter.split(sp.stages, sp.micro_batch_size, m) if self.resplit else None
            pipes.append(again or PipelineSplit(sp.stages, sp.micro_batch_size, m, float("nan"), sp.bounds, sp.layers))
        # ``allocate`` balances the closed form; the estimate (the schedules simulated) has the last word.
        scored = [c for c in (self.score(shape, pipes), self.score(shape, nominal)) if c is not None]
        return min(scored, key=lambda c: c.time, default=None)

    def rate(self, sp: PipelineSplit) -> PipelineRate:
        """FB_i, ST_i and p2p of a split pipeline (its strategies fixed) for ``allocate``."""
        if sp.key and sp.key in self._rates:
            return self._rates[sp.key]
        p = len(sp.stages)
        fb, st, p2p = [], [], 0.0
        index = self.model.index()
        ctxs = pipeline_contexts(self.cluster, [tuple(d) for d in sp.stages], sp.micro_batch_size, sp.num_microbatches,
                                 self.opts.params)  # the first and last stage name each other (tied embeddings)
        for i, (devs, layers, ctx) in enumerate(zip(sp.stages, sp.layers, ctxs)):
            k = inflight_microbatches(self.opts.schedule, p, i, sp.num_microbatches)
            specs = [self.model.layers[index[ly.name]] for ly in layers]
            _, f, b, s, _ = stage_cost(specs, [ly.strategy for ly in layers], ctx, k, self.costs)
            fb.append(f + b)
            st.append(s)
            if i + 1 < p:
                p2p += 2.0 * boundary_p2p_time(self.cluster, list(devs), list(sp.stages[i + 1]),
                                               specs[-1].boundary_bytes, sp.micro_batch_size)
        rate = PipelineRate(sp.micro_batch_size, fb, st, p2p, max_m=self.B, slot_s=self.opts.params.slot_overhead_s)
        if sp.key:
            self._rates[sp.key] = rate
        return rate

    def score(self, shape: Shape, pipes: list[PipelineSplit]) -> Candidate | None:
        plan = Plan(model_ref(self.model), self.cluster, self.B,
                    [Pipeline(sp.share, sp.micro_batch_size, sp.num_microbatches, sp.plan_stages()) for sp in pipes],
                    schedule=self.opts.schedule, memory_budget_gib=self.opts.memory_budget_gib)
        if sum(p.batch_share for p in plan.pipelines) != self.B:
            return None
        est = estimate_plan(plan, self.model, self.opts.params, self.costs)
        if not est.fits:
            return None
        return Candidate(shape, plan, est)
