"""estimate_plan: the predicted step time, throughput, MFU and per-device memory of a Plan.

The search builds its plans from the same ``layer_costs`` / ``stage_cost`` pieces and sums them in
the same order, so ``estimate_plan(search_result.plan)`` returns the very number the search optimised.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from autopar.cluster.cluster import GIB, Cluster
from autopar.estimate.cache import CostCache
from autopar.estimate.context import device_budget_bytes
from autopar.estimate.cross_pipeline import cross_pipeline_sync_time
from autopar.estimate.interleaved import estimate_any
from autopar.estimate.pipeline import StageEstimate, pipeline_stages, pipeline_time, step_lower_bound
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from cost_models import CostParams


@dataclass
class PlanEstimate:
    """A plan's predicted figures. Memory is kept per stage (every device of a stage holds the same peak);
    the per-device views ``memory_gib`` and ``budget_gib`` are built on first read, since at 100k devices
    building them for every plan a search scores would cost more than scoring it."""

    step_time_s: float
    tokens_per_s: float
    tps: float
    tflops: float
    mfu: float
    pipelines: list[list[StageEstimate]]
    pipeline_times_s: list[float]
    stage_budget_gib: list[list[float]]  # per stage: the least any of its devices may use
    cluster: Cluster = field(repr=False, compare=False)  # the plan's: the per-device views read its nodes
    node_budget_gib: list[float] = field(repr=False, compare=False)  # per node of ``cluster``: what a device may use

    def _stages(self) -> Iterator[tuple[StageEstimate, float]]:
        """Every stage with devices, with its budget."""
        for stages, budgets in zip(self.pipelines, self.stage_budget_gib):
            yield from ((st, b) for st, b in zip(stages, budgets) if st.devices)

    @cached_property
    def memory_gib(self) -> dict[int, float]:
        """Device -> predicted peak GiB (its stage's), in plan order."""
        mem: dict[int, float] = {}
        for st, _ in self._stages():
            mem.update(dict.fromkeys(st.devices, st.memory_gib))
        return mem

    @cached_property
    def budget_gib(self) -> dict[int, float]:
        """Device -> GiB it may use (``memory_budget_gib``, else its GPU's memory), in plan order."""
        devices = list(itertools.chain.from_iterable(st.devices for st, _ in self._stages()))
        return dict(zip(devices, map(self.node_budget_gib.__getitem__, self.cluster.nodes_of(devices))))

    @property
    def max_memory_gib(self) -> float:
        return max(st.memory_gib for st, _ in self._stages())

    @property
    def fits(self) -> bool:
        """Every device's peak within its budget (to 1e-9 GiB): per stage, its peak within its least budget."""
        return all(st.memory_gib <= budget + 1e-9 for st, budget in self._stages())

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
        stages, t = estimate_any(pipe, model, cluster, plan.schedule, params, cache)
        pipes.append(stages)
        times.append(t)
    step = max(times)
    if len(plan.pipelines) > 1:
        step = step + cross_pipeline_sync_time(plan, model, params, pipes, times, cache)
    return finish_estimate(plan, model, pipes, times, step)


BOUND_MARGIN = 1e-9  # relative: far above the rounding between step_lower_bound and the simulated sum


def estimate_plan_if_faster(plan: Plan, model: ModelSpec, params: CostParams, cache: CostCache,
                            than: float) -> PlanEstimate | None:
    """``estimate_plan(plan, model, params, cache)`` when the plan fits and may be faster than ``than`` seconds;
    None when it does not fit, or when its step time is proven >= ``than`` (``step_lower_bound``, for a single
    1F1B or GPipe pipeline without virtual stages), without simulating its schedule. A caller that keeps
    the fastest fitting plan (strictly faster) keeps the very plan and estimate it would keep otherwise."""
    pipe = plan.pipelines[0]
    if len(plan.pipelines) > 1 or pipe.virtual_stages > 1 or plan.schedule not in ("1f1b", "gpipe"):
        est = estimate_plan(plan, model, params, cache)
        return est if est.fits else None
    stages = pipeline_stages(pipe, model, plan.cluster, plan.schedule, params, cache)
    if not finish_estimate(plan, model, [stages], [1.0], 1.0).fits:  # fits reads memory only, not the step
        return None
    if step_lower_bound(stages, pipe.num_microbatches, params) * (1.0 - BOUND_MARGIN) >= than:
        return None
    t = pipeline_time(stages, pipe.num_microbatches, params, plan.schedule)
    return finish_estimate(plan, model, [stages], [t], t)  # estimate_plan's figures: max([t]) = t, one pipeline


def finish_estimate(plan: Plan, model: ModelSpec, pipes: list[list[StageEstimate]], times: list[float],
                    step: float) -> PlanEstimate:
    """Throughput, MFU and per-stage memory budgets from the per-stage figures and the step time.

    Per-device facts are memoised on the cluster per device group (and per plan's groups), so scoring
    a plan costs no pass over its devices beyond its stages' own.
    """
    cluster = plan.cluster
    # An interleaved pipeline lists each physical stage's chunks: count its devices once.
    stages = [st for pipe, p in zip(plan.pipelines, pipes) for st in p[:pipe.num_stages]]
    num_devices = sum(len(st.devices) for st in stages)
    tokens = plan.global_batch_size * model.tokens_per_sample
    tokens_per_s = tokens / step
    flops_per_s = plan.global_batch_size * model.model_flops_per_sample / step
    node_flops = cluster.memoised(("node_flops",), lambda: [nd.gpu.flops for nd in cluster.nodes])

    def peak_sum() -> float:  # one sum over the devices in plan order, as the figure has always been summed
        devices = itertools.chain.from_iterable(st.devices for st in stages)
        return sum(map(node_flops.__getitem__, cluster.nodes_of(list(devices))))

    peak_total = cluster.memoised(("peak_flops_sum", tuple(st.group for st in stages)), peak_sum)
    node_cap = cluster.memoised(("node_budget_gib", plan.memory_budget_gib),
                                lambda: [device_budget_bytes(cluster, first, plan.memory_budget_gib) / GIB
                                         for first in cluster.first_devices()])

    def least_budget(st: StageEstimate) -> float:
        return cluster.memoised(("least_budget_gib", st.group, plan.memory_budget_gib),
                                lambda: min(map(node_cap.__getitem__, set(cluster.nodes_of(st.devices))), default=0.0))

    return PlanEstimate(
        step_time_s=step,
        tokens_per_s=tokens_per_s,
        tps=tokens_per_s / num_devices,
        tflops=flops_per_s / num_devices / 1e12,
        mfu=flops_per_s / peak_total,
        pipelines=pipes,
        pipeline_times_s=times,
        stage_budget_gib=[[least_budget(st) for st in p] for p in pipes],
        cluster=cluster,
        node_budget_gib=node_cap,
    )
