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
from autopar.estimate.layer_cost import StageContext
from autopar.estimate.plan_cost import PlanEstimate, boundary_p2p_time, estimate_plan, stage_cost
from autopar.model.spec import ModelSpec
from autopar.plan.schema import ModelRef, Pipeline, Plan
from autopar.search.hetero.batch_shares import PipelineRate, allocate, proportional
from autopar.search.hetero.graph_partition import Shape, canonical
from autopar.search.hetero.layer_split import LayerSplitter, PipelineSplit
from autopar.search.options import SearchOptions
from cost_models.memory import inflight_microbatches


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
                 splitter: LayerSplitter):
        self.model, self.cluster, self.B, self.opts, self.splitter = model, cluster, global_batch_size, opts, splitter
        self.cache: dict[Shape, Candidate | None] = {}
        self.evaluated = 0

    def __call__(self, shape: Shape) -> Candidate | None:
        key = canonical(shape)
        if key in self.cache:
            return self.cache[key]
        try:
            cand = self._realise(key)
        except AutoparError:
            cand = None
        self.cache[key] = cand
        self.evaluated += 1
        return cand

    def _realise(self, shape: Shape) -> Candidate | None:
        if len(shape) > self.B:
            return None
        if len(shape) == 1:
            sp = self.splitter.best(list(shape[0]), self.B)
            return None if sp is None else self.score(shape, [sp])
        weights = [sum(self.cluster.gpu_of(d).tflops for st in p for d in st) for p in shape]
        shares = proportional(self.B, weights, [1] * len(shape))
        if not shares:
            return None
        nominal = [self.splitter.best(list(p), b) for p, b in zip(shape, shares)]
        if any(sp is None for sp in nominal):
            return None
        first = self.score(shape, nominal)
        ms = allocate(self.B, [self.rate(sp) for sp in nominal])
        if ms is None or all(m == sp.num_microbatches for m, sp in zip(ms, nominal)):
            return first
        pipes = []
        for sp, m in zip(nominal, ms):
            if m == sp.num_microbatches:
                pipes.append(sp)
                continue
            again = self.splitter.split(sp.stages, sp.micro_batch_size, m)
            pipes.append(again or PipelineSplit(sp.stages, sp.micro_batch_size, m, float("nan"), sp.bounds, sp.layers))
        second = self.score(shape, pipes)
        if first is None or (second is not None and second.time < first.time):
            return second
        return first

    def rate(self, sp: PipelineSplit) -> PipelineRate:
        """FB_i, ST_i and p2p of a split pipeline (its strategies fixed) for ``allocate``."""
        p = len(sp.stages)
        fb, st, p2p = [], [], 0.0
        index = self.model.index()
        for i, (devs, layers) in enumerate(zip(sp.stages, sp.layers)):
            ctx = StageContext(self.cluster, tuple(devs), sp.micro_batch_size, sp.num_microbatches, self.opts.params)
            k = inflight_microbatches(self.opts.schedule, p, i, sp.num_microbatches)
            specs = [self.model.layers[index[ly.name]] for ly in layers]
            _, f, b, s, _ = stage_cost(specs, [ly.strategy for ly in layers], ctx, k)
            fb.append(f + b)
            st.append(s)
            if i + 1 < p:
                p2p += 2.0 * boundary_p2p_time(self.cluster, list(devs), list(sp.stages[i + 1]),
                                               specs[-1].boundary_bytes, sp.micro_batch_size)
        return PipelineRate(sp.micro_batch_size, fb, st, p2p, max_m=self.B)

    def score(self, shape: Shape, pipes: list[PipelineSplit]) -> Candidate | None:
        plan = Plan(model_ref(self.model), self.cluster, self.B,
                    [Pipeline(sp.share, sp.micro_batch_size, sp.num_microbatches, sp.plan_stages()) for sp in pipes],
                    schedule=self.opts.schedule, memory_budget_gib=self.opts.memory_budget_gib)
        if sum(p.batch_share for p in plan.pipelines) != self.B:
            return None
        est = estimate_plan(plan, self.model, self.opts.params)
        if not est.fits:
            return None
        return Candidate(shape, plan, est)
