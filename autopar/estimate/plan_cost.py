"""estimate_plan: the predicted step time, throughput, MFU and per-device memory of a Plan.

The search builds its plans from the same ``layer_costs`` / ``stage_cost`` pieces and sums them in
the same order, so ``estimate_plan(search_result.plan)`` returns the very number the search optimised.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field

from autopar.cluster.cluster import GIB
from autopar.estimate.cache import CostCache
from autopar.estimate.context import device_budget_bytes
from autopar.estimate.cross_pipeline import cross_pipeline_sync_time
from autopar.estimate.pipeline import StageEstimate, estimate_pipeline
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from cost_models import CostParams


@dataclass
class PlanEstimate:
    step_time_s: float
    tokens_per_s: float
    tps: float
    tflops: float
    mfu: float
    pipelines: list[list[StageEstimate]]
    pipeline_times_s: list[float]
    memory_gib: dict[int, float] = field(default_factory=dict)  # device -> predicted peak
    budget_gib: dict[int, float] = field(default_factory=dict)  # device -> what it may use

    @property
    def max_memory_gib(self) -> float:
        return max(self.memory_gib.values())

    @property
    def fits(self) -> bool:
        caps = map(operator.add, map(self.budget_gib.__getitem__, self.memory_gib), itertools.repeat(1e-9))
        return all(map(operator.le, self.memory_gib.values(), caps))

    def predicted(self) -> dict:
        """The ``predicted`` block of a plan file (torchtitan's metric names)."""
        return {
            "step_time_s": float(self.step_time_s),
            "tokens_per_s": float(self.tokens_per_s),
            "tps": float(self.tps),
            "tflops": float(self.tflops),
            "mfu": float(self.mfu),
            "max_memory_gib": float(self.max_memory_gib),
            "memory_gib": {"per_stage": [[round(float(s.memory_gib), 3) for s in p] for p in self.pipelines]},
        }


def plan_cost_params(plan: Plan) -> CostParams:
    """The cost parameters ``plan`` was searched with (the defaults for a plan that records none)."""
    return CostParams.from_dict(plan.search.get("cost_params") or {})


def estimate_plan(plan: Plan, model: ModelSpec, params: CostParams | None = None,
                  cache: CostCache | None = None) -> PlanEstimate:
    """Predicted figures of ``plan`` for ``model`` on the plan's own cluster.

    ``params``: the cost parameters; by default the plan's own (those it was searched with, recorded in
    ``plan.search["cost_params"]``), so a loaded plan estimates to its ``predicted`` figures.
    ``cache``: the caller's memo when it runs many estimates (a search, baselines); none makes a fresh one.
    """
    params = params if params is not None else plan_cost_params(plan)
    cache = cache if cache is not None else CostCache()
    cluster = plan.cluster
    pipes, times = [], []
    for pipe in plan.pipelines:
        stages, t = estimate_pipeline(pipe, model, cluster, plan.schedule, params, cache)
        pipes.append(stages)
        times.append(t)
    step = max(times)
    if len(plan.pipelines) > 1:
        step = step + cross_pipeline_sync_time(plan, model, params, pipes, times, cache)
    return finish_estimate(plan, model, pipes, times, step)


def finish_estimate(plan: Plan, model: ModelSpec, pipes: list[list[StageEstimate]], times: list[float],
                    step: float) -> PlanEstimate:
    """Throughput, MFU and per-device memory from the per-stage figures and the step time."""
    cluster = plan.cluster
    devices = plan.devices
    tokens = plan.global_batch_size * model.tokens_per_sample
    tokens_per_s = tokens / step
    flops_per_s = plan.global_batch_size * model.model_flops_per_sample / step
    nodes = cluster.nodes_of(devices)
    node_flops = cluster.memoised(("node_flops",), lambda: [nd.gpu.flops for nd in cluster.nodes])
    peak_total = sum(map(node_flops.__getitem__, nodes))
    mem: dict[int, float] = {}
    for p in pipes:
        for st in p:
            mem.update(dict.fromkeys(st.devices, st.memory_bytes / GIB))
    node_cap = cluster.memoised(("node_budget_gib", plan.memory_budget_gib),
                                lambda: [device_budget_bytes(cluster, first, plan.memory_budget_gib) / GIB
                                         for first in cluster.first_devices()])
    budget = dict(zip(devices, map(node_cap.__getitem__, nodes)))
    return PlanEstimate(
        step_time_s=step,
        tokens_per_s=tokens_per_s,
        tps=tokens_per_s / len(devices),
        tflops=flops_per_s / len(devices) / 1e12,
        mfu=flops_per_s / peak_total,
        pipelines=pipes,
        pipeline_times_s=times,
        memory_gib=mem,
        budget_gib=budget,
    )
