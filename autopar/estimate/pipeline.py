"""One pipeline of a Plan priced by the cost model: per-stage figures and the pipeline's step time (its
schedule table simulated: ``pipeline_time``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from autopar.cluster.cluster import GIB, Cluster
from autopar.errors import AutoparError
from autopar.estimate.cache import CostCache
from autopar.estimate.context import StageContext, context_link, stage_contexts, stage_link
from autopar.modelspec.spec import LayerSpec, ModelSpec
from autopar.plan.schema import Pipeline, Strategy
from cost_models import CostParams
from cost_models import pipeline as pipe_model
from cost_models import stage as stage_model
from cost_models.memory import inflight_microbatches


@dataclass
class StageEstimate:
    devices: list[int]
    layers: list[str]
    cost_per_microbatch_s: float  # fwd + bwd + step/m of every layer, plus layout switches
    fwd_s: float
    bwd_s: float
    step_s: float
    inflight: int
    memory_bytes: float  # peak per rank (states + in-flight activations + transient + reserve)
    p2p_s: float = 0.0  # send to the next stage, one micro-batch, one direction
    # The cluster's id of the stage's device group (StageContext.group): the key of per-group facts.
    group: int = field(default=-1, repr=False, compare=False)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


def stage_cost(layers: list[LayerSpec], strategies: list[Strategy], ctx: StageContext, inflight: int,
               cache: CostCache | None = None) -> stage_model.StageCost:
    """(cost per micro-batch, fwd, bwd, step, peak bytes per rank) of one stage (``cost_models.stage``).

    ``cache``: the caller's memo of per-layer costs (none: each layer is priced afresh).
    """
    if cache is None:
        return stage_model.stage_cost(layers, strategies, ctx, inflight)
    return stage_model.stage_cost(layers, strategies, ctx, inflight, cache.layer_cost)


def boundary_p2p_time(cluster: Cluster, src_devices: list[int], dst_devices: list[int],
                      boundary_bytes: float, micro_batch_size: int) -> float:
    """One micro-batch's activations from one stage to the next, over the slowest link between them."""
    return _p2p_over(stage_link(cluster, src_devices, dst_devices), boundary_bytes, micro_batch_size)


def _p2p_over(link: tuple[float, float], boundary_bytes: float, micro_batch_size: int) -> float:
    bw, lat = link
    return float(pipe_model.boundary_p2p_time(boundary_bytes, micro_batch_size, bw, lat))


def pipeline_time(stages: list[StageEstimate], num_microbatches: int, params: CostParams,
                  schedule: str = "1f1b", virtual_stages: int = 1) -> float:
    """The step time of the stages (in stage order; with virtual stages, in chunk order): their schedule
    table simulated (``cost_models.pipeline.simulated_pipeline_time``) with each stage's forward and
    backward (``action_times``), its boundary send ``p2p_s`` each way and its step tail once.

    Memoised on the figures (a pure function of them): a search scores equal pipelines many times."""
    return _simulated(schedule, num_microbatches, tuple(st.cost_per_microbatch_s for st in stages),
                      tuple(st.fwd_s for st in stages), tuple(st.step_s for st in stages),
                      tuple(st.p2p_s for st in stages), params.slot_overhead_s, virtual_stages)


@functools.lru_cache(maxsize=1 << 16)
def _simulated(schedule: str, m: int, costs: tuple, fwds: tuple, steps: tuple, sends: tuple, slot_s: float,
               v: int) -> float:
    return pipe_model.simulated_pipeline_time(schedule, m, costs, fwds, steps, sends, slot_s, v)


def spec_layers(model: ModelSpec, index: dict[str, int], names: list[str]) -> list[LayerSpec]:
    """The model's units of these names (``index``: ``model.index()``); one line naming a unit it lacks."""
    try:
        return [model.layers[index[n]] for n in names]
    except KeyError as e:
        raise AutoparError("plan.pipelines.stages.layers", f"unit {e.args[0]!r} is not in model {model.name}",
                           "search the plan again for this model") from None


def estimate_pipeline(pipe: Pipeline, model: ModelSpec, cluster: Cluster, schedule: str, params: CostParams,
                      cache: CostCache | None = None) -> tuple[list[StageEstimate], float]:
    """Per-stage estimates of one pipeline and its step time (before any cross-pipeline sync)."""
    out = pipeline_stages(pipe, model, cluster, schedule, params, cache)
    return out, pipeline_time(out, pipe.num_microbatches, params, schedule)


def step_lower_bound(stages: list[StageEstimate], num_microbatches: int, params: CostParams) -> float:
    """A lower bound of ``pipeline_time`` (1F1B or GPipe, no virtual stages) of these stages, to rounding:
    every stage runs its m forwards and m backwards (``action_times``: w + o per micro-batch) one after
    another, then its tail, so the step is at least max over stages of m (w + o) + s. Sends, waits and
    link queues only add. Callers compare it with a relative margin (the simulation sums in another order)."""
    m, o = num_microbatches, params.slot_overhead_s
    return max((m * (pipe_model.stage_work(st.cost_per_microbatch_s, st.step_s, m) + o) + st.step_s
                for st in stages), default=0.0)


def pipeline_stages(pipe: Pipeline, model: ModelSpec, cluster: Cluster, schedule: str, params: CostParams,
                    cache: CostCache | None = None) -> list[StageEstimate]:
    """Per-stage estimates of one pipeline (``estimate_pipeline`` without the step time)."""
    cache = cache if cache is not None else CostCache()
    index = model.index()
    p = len(pipe.stages)
    ctxs = stage_contexts(pipe, cluster, params)
    out: list[StageEstimate] = []
    for i, (st, ctx) in enumerate(zip(pipe.stages, ctxs)):
        layers = spec_layers(model, index, [ly.name for ly in st.layers])
        k = inflight_microbatches(schedule, p, i, pipe.num_microbatches)
        cost, fwd, bwd, step, peak = stage_cost(layers, [ly.strategy for ly in st.layers], ctx, k, cache)
        p2p = 0.0
        if i + 1 < p:  # the link memoised per pair of device groups: no pass over the devices per estimate
            p2p = _p2p_over(context_link(ctx, ctxs[i + 1]), layers[-1].boundary_bytes, pipe.micro_batch_size)
        out.append(StageEstimate(list(ctx.devices), [ly.name for ly in st.layers], cost, fwd, bwd, step, k, peak, p2p,
                                 group=ctx.group))
    return out
