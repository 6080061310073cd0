"""Memory per device, by part, from the cost model's own terms (what ``StageEstimate.memory_bytes`` sums).

A stage's peak per rank (``cost_models.stage.stage_cost``) is its layers' model states, plus the
activations of its in-flight micro-batches, plus the largest transient working set of one layer, plus
the framework reserve. The model states split by ZeRO stage as ``cost_models.memory.model_state_bytes``
counts them (parameters, gradients, optimizer states: master copy and Adam moments); a measured state
table (a profile's) gives one a + b/d figure per parameter, shown as one part, "model states".
Every device of a stage holds the same peak, so one bar stands for the whole stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cluster.cluster import GIB
from autopar.estimate import PlanEstimate
from autopar.estimate.cache import CostCache
from autopar.estimate.context import chunk_contexts
from autopar.estimate.pipeline import spec_layers
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from cost_models import CostParams
from cost_models.layer import shard_params
from cost_models.memory import model_state_bytes
from cost_models.ties import held_params
from cost_models.transient import transient_bytes

PARTS = ("parameters", "gradients", "optimizer states", "model states", "activations", "transient", "reserve")


@dataclass
class StageMemory:
    """One stage's per-device peak in GiB by part (``PARTS``; absent parts are 0) and its budget."""

    pipeline: int
    stage: int
    devices: list[int]
    gpu: str
    parts: dict[str, float]
    total_gib: float  # the estimate's StageEstimate.memory_gib
    budget_gib: float  # the least any device of the stage may use

    @property
    def summed_gib(self) -> float:
        return sum(self.parts.values())


def _state_split(shard: float, zero: int, dp: int, p: CostParams) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer) bytes one rank holds for ``shard`` parameters; their sum is
    ``model_state_bytes`` (the optimizer part is what is left of it)."""
    total = float(model_state_bytes(shard, zero, dp, p.state_bytes, p.param_bytes, p.state_table, p.grad_bytes))
    d = max(dp, 1)
    params = shard * p.param_bytes / (d if zero == 3 else 1)
    grads = shard * p.grad_bytes / (d if zero >= 2 else 1)
    return params, grads, total - params - grads


def stage_memory(plan: Plan, model: ModelSpec, est: PlanEstimate, params: CostParams) -> list[StageMemory]:
    """Per stage of ``plan`` (estimated as ``est`` with ``params``), its per-device peak by part."""
    cache = CostCache()
    index = model.index()
    out = []
    for pi, (pipe, stages, budgets) in enumerate(zip(plan.pipelines, est.pipelines, est.stage_budget_gib)):
        ctxs = chunk_contexts(pipe, plan.cluster, params)
        for si, (st, se, budget) in enumerate(zip(pipe.stages, stages, budgets)):
            ctx = ctxs[si]
            parts = dict.fromkeys(PARTS, 0.0)
            transient = 0.0
            for spec, ly in zip(spec_layers(model, index, [x.name for x in st.layers]), st.layers):
                s = ly.strategy
                lc = cache.layer_cost(spec, s, ctx)
                if params.state_table:
                    parts["model states"] += lc.mem_states
                else:
                    shard = float(shard_params(spec, np.array([float(s.tp)]), held_params(spec, ctx, params))[0])
                    dp = len(st.devices) // s.tp
                    splits = [(shard, dp)]
                    if s.ep > 1 and spec.moe is not None:  # 1/ep of the experts, ZeRO over dp/ep (cost_models.moe)
                        splits = [(shard - spec.moe.expert_params, dp), (spec.moe.expert_params / s.ep, dp // s.ep)]
                    for part, group in splits:
                        pa, gr, op = _state_split(part, s.zero, group, params)
                        parts["parameters"] += pa
                        parts["gradients"] += gr
                        parts["optimizer states"] += op
                parts["activations"] += se.inflight * lc.mem_act
                transient = max(transient, transient_bytes(spec, ctx, s))
            parts["transient"] = transient
            parts["reserve"] = params.reserve_bytes
            out.append(StageMemory(pi, si, list(st.devices), plan.cluster.gpu_of(st.devices[0]).name,
                                   {k: v / GIB for k, v in parts.items()}, se.memory_gib, budget))
    return out
