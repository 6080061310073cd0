"""An interleaved pipeline (``virtual_stages`` v > 1) priced from its schedule table.

Each of the p * v chunks is priced like a stage (``stage_cost``); the physical stage s runs chunks
s, s + p, ... . The step time is ``autopar.estimate.pipeline.pipeline_time``, the simulation of the very
table the runtime executes, with per-chunk forward and backward times and the p2p of every chunk
boundary (the boundary from stage p - 1 back to stage 0 included), split as every schedule's is
(``cost_models.pipeline.action_times``: each chunk's micro-batch pays the schedule-slot overhead; each
physical stage pays its chunks' step tails once, after its last slot). A stage's memory is its chunks'
model states, the peak over the table of its chunks' in-flight activations (``inflight_profile``
weighted by each chunk's bytes), the largest transient and the reserve; every chunk of the stage reports that one figure, so per-device views need
no special case.
"""

from __future__ import annotations

from autopar.cluster.cluster import Cluster
from autopar.estimate.cache import CostCache
from autopar.estimate.context import context_link, stage_contexts
from autopar.estimate.pipeline import StageEstimate, estimate_pipeline, pipeline_time, spec_layers, stage_cost
from autopar.estimate.zero_bubble import estimate_zero_bubble
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Pipeline
from cost_models import CostParams
from cost_models.pipeline import boundary_p2p_time
from cost_models.pipeline_schedules import peak_inflight, schedule_table


def estimate_interleaved(pipe: Pipeline, model: ModelSpec, cluster: Cluster, params: CostParams,
                         cache: CostCache) -> tuple[list[StageEstimate], float]:
    """Per-chunk estimates (in the plan's chunk order) of one interleaved pipeline and its step time."""
    index = model.index()
    p, v, m, mbs = pipe.num_stages, pipe.virtual_stages, pipe.num_microbatches, pipe.micro_batch_size
    ctxs = stage_contexts(pipe, cluster, params)
    table = schedule_table("interleaved", p, m, v)
    chunks = []  # per chunk g: (layers, strategies, cost at 0 in flight, activation bytes of one micro-batch)
    for g, st in enumerate(pipe.stages):
        layers = spec_layers(model, index, st.layer_names)
        strategies = [ly.strategy for ly in st.layers]
        c0 = stage_cost(layers, strategies, ctxs[g % p], 0, cache)
        act = stage_cost(layers, strategies, ctxs[g % p], 1, cache).peak_bytes - c0.peak_bytes
        chunks.append((layers, strategies, c0, act))
    memory, live_at_peak = [], []
    for s in range(p):
        mine = range(s, p * v, p)
        acts = [chunks[g][3] for g in mine]
        peak_live = peak_inflight(table[s], acts)
        together = stage_cost([ly for g in mine for ly in chunks[g][0]], [x for g in mine for x in chunks[g][1]],
                              ctxs[s], 0, cache).peak_bytes  # every chunk's states, the largest transient, reserve
        memory.append(together + sum(n * a for n, a in zip(peak_live, acts)))
        live_at_peak.append(peak_live)
    out = []
    for g, (layers, _, c0, _) in enumerate(chunks):
        s = g % p
        send = 0.0
        if g + 1 < p * v:
            bw, lat = context_link(ctxs[s], ctxs[(g + 1) % p])
            send = float(boundary_p2p_time(layers[-1].boundary_bytes, mbs, bw, lat))
        out.append(StageEstimate(list(ctxs[s].devices), [ly.name for ly in layers], c0.cost, c0.fwd, c0.bwd, c0.step,
                                 live_at_peak[s][g // p], memory[s], send, group=ctxs[s].group))
    return out, pipeline_time(out, m, params, "interleaved", v)


def estimate_any(pipe: Pipeline, model: ModelSpec, cluster: Cluster, schedule: str, params: CostParams,
                 cache: CostCache | None = None) -> tuple[list[StageEstimate], float]:
    """``estimate_interleaved`` for a pipeline with virtual stages, ``estimate_zero_bubble`` under ``zb-h1``,
    else ``estimate_pipeline``."""
    if schedule == "zb-h1" and pipe.virtual_stages == 1:
        return estimate_zero_bubble(pipe, model, cluster, params, cache)
    if pipe.virtual_stages > 1:
        return estimate_interleaved(pipe, model, cluster, params, cache if cache is not None else CostCache())
    return estimate_pipeline(pipe, model, cluster, schedule, params, cache)
