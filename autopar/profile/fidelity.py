"""Predicted against measured: the pieces of the cost-model fidelity benchmark that tests reuse.

``predicted_memory`` splits the cost model's per-rank memory into the two parts a run can measure
exactly: model states (parameters, gradients, optimizer state) and saved activations at the stage's
peak (in-flight micro-batches x saved bytes per micro-batch). ``compare`` turns predicted and measured
step times into the summary figures (MAPE, Spearman, the model's first choice against the fastest).
"""

from __future__ import annotations

import numpy as np

from autopar.estimate import layer_costs
from autopar.estimate.context import chunk_contexts
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from cost_models import CostParams
from cost_models.memory import inflight_microbatches
from cost_models.pipeline_schedules import peak_inflight, schedule_table


def predicted_memory(plan: Plan, model: ModelSpec, params: CostParams) -> dict[int, dict[str, float]]:
    """Per device: {"states": model-state bytes, "saved": saved-activation bytes at the peak}. An interleaved
    stage holds every one of its chunks' states, and its chunks' activations weighed at the peak of its
    schedule's in-flight micro-batches (``peak_inflight``, as ``estimate.interleaved`` weighs them)."""
    index = model.index()
    out: dict[int, dict[str, float]] = {}
    for pipe in plan.pipelines:
        p, v, m = pipe.num_stages, pipe.virtual_stages, pipe.num_microbatches
        states, acts = [0.0] * p, [[0.0] * v for _ in range(p)]  # per stage; per stage and chunk, one micro-batch
        for g, (st, ctx) in enumerate(zip(pipe.stages, chunk_contexts(pipe, plan.cluster, params))):
            for ly in st.layers:
                lc = layer_costs(model.layers[index[ly.name]], [ly.strategy], ctx)
                states[g % p] += float(lc.mem_states[0])
                acts[g % p][g // p] += float(lc.mem_act[0])
        table = schedule_table(plan.schedule, p, m, v) if v > 1 else None
        for s, st in enumerate(pipe.physical_stages):
            if table is None:
                saved = inflight_microbatches(plan.schedule, p, s, m) * acts[s][0]
            else:
                saved = sum(n * a for n, a in zip(peak_inflight(table[s], acts[s]), acts[s]))
            for d in st.devices:
                out[d] = {"states": states[s], "saved": saved}
    return out


def compare(predicted: list[float], measured: list[float]) -> dict:
    """MAPE, Spearman rank correlation, and how the model's first choice fares against the fastest."""
    from scipy.stats import spearmanr

    pred, meas = np.asarray(predicted, float), np.asarray(measured, float)
    err = np.abs(pred - meas) / meas
    first = int(np.argmin(pred))
    fastest = int(np.argmin(meas))
    rho = float(spearmanr(pred, meas).statistic) if len(pred) > 1 else float("nan")
    return {"mape": float(err.mean()), "max_ape": float(err.max()), "spearman": rho, "first_choice": first,
            "measured_fastest": fastest, "first_choice_gap": float(meas[first] / meas[fastest] - 1.0)}
