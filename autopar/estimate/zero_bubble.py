"""A zero-bubble (``zb-h1``) pipeline priced from its schedule table.

Each stage is priced as under 1F1B (``stage_cost``), except that it holds the activations of every
micro-batch whose W has not run: the peak of ``inflight_profile`` over the ``zb-h1`` table (min(p, m)
on every stage, where 1F1B holds min(p - s, m)). Its backward splits into W (weight gradients,
``cost_models.zero_bubble.weight_grad_time`` summed over its layers) and B (the rest of the backward),
split as every schedule's (``cost_models.pipeline.action_times``; the step tail runs once after the
stage's last slot). The step time is ``simulate_pipeline`` over the very table the runtime executes, W
actions included.
"""

from __future__ import annotations

from autopar.cluster.cluster import Cluster
from autopar.estimate.cache import CostCache
from autopar.estimate.context import context_link, stage_contexts
from autopar.estimate.pipeline import StageEstimate, spec_layers, stage_cost
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Pipeline
from cost_models import CostParams
from cost_models.pipeline import boundary_p2p_time, simulate_pipeline
from cost_models.pipeline_schedules import peak_inflight, schedule_table
from cost_models.zero_bubble import weight_grad_time

SCHEDULE = "zb-h1"


def zero_bubble_inflight(num_stages: int, num_microbatches: int) -> list[int]:
    """Per stage, the most micro-batches whose activations it holds in the ``zb-h1`` table (F run, W not)."""
    table = schedule_table(SCHEDULE, num_stages, num_microbatches)
    return [peak_inflight(slots, [1.0])[0] for slots in table]


def estimate_zero_bubble(pipe: Pipeline, model: ModelSpec, cluster: Cluster, params: CostParams,
                         cache: CostCache | None = None) -> tuple[list[StageEstimate], float]:
    """Per-stage estimates of one ``zb-h1`` pipeline and its step time (before any cross-pipeline sync)."""
    cache = cache if cache is not None else CostCache()
    index = model.index()
    p, m, mbs = len(pipe.stages), pipe.num_microbatches, pipe.micro_batch_size
    ctxs = stage_contexts(pipe, cluster, params)
    ks = zero_bubble_inflight(p, m)
    out: list[StageEstimate] = []
    costs, fwds, steps, wgt, p2p = [], [], [], [], []
    for i, (st, ctx) in enumerate(zip(pipe.stages, ctxs)):
        layers = spec_layers(model, index, [ly.name for ly in st.layers])
        strategies = [ly.strategy for ly in st.layers]
        c = stage_cost(layers, strategies, ctx, ks[i], cache)
        w = min(sum(weight_grad_time(ly, s, ctx) for ly, s in zip(layers, strategies)), c.bwd)
        send = 0.0
        if i + 1 < p:
            bw, lat = context_link(ctx, ctxs[i + 1])
            send = float(boundary_p2p_time(layers[-1].boundary_bytes, mbs, bw, lat))
        costs.append(c.cost)
        fwds.append(c.fwd)
        steps.append(c.step)
        wgt.append(w)
        p2p.append(send)
        out.append(StageEstimate(list(ctx.devices), [ly.name for ly in layers], c.cost, c.fwd, c.bwd, c.step, ks[i],
                                 c.peak_bytes, send, group=ctx.group))
    return out, simulate_pipeline(SCHEDULE, m, costs, fwds, steps, p2p, params.slot_overhead_s, wgts=wgt).step_s
