"""estimate_plan: the predicted step time, throughput, MFU and per-device memory of a Plan.

The search builds its plans from the same ``layer_costs`` / ``stage_cost`` pieces and sums them in
the same order, so ``estimate_plan(search_result.plan)`` returns the very number the search optimised.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from autopar.cluster.cluster import GIB, Cluster
from autopar.errors import AutoparError
from autopar.estimate.layer_cost import StageContext, layer_costs, layout_switch_time, transient_bytes
from autopar.modelspec.spec import LayerSpec, ModelSpec
from autopar.plan.schema import Pipeline, Plan, Strategy
from cost_models import CostParams
from cost_models import communication as comm
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

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


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
        return all(self.memory_gib[d] <= self.budget_gib[d] + 1e-9 for d in self.memory_gib)

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


_COST_CACHE: dict = {}
_NAMELESS: dict[int, tuple[LayerSpec, LayerSpec]] = {}


def _nameless(ly: LayerSpec) -> LayerSpec:
    """The layer without its name (repeated blocks share cache entries); memoised per object."""
    hit = _NAMELESS.get(id(ly))
    if hit is None or hit[0] is not ly:
        if len(_NAMELESS) > 100_000:
            _NAMELESS.clear()
        hit = (ly, replace(ly, name=""))
        _NAMELESS[id(ly)] = hit
    return hit[1]


def _one_layer_cost(ly: LayerSpec, s: Strategy, ctx: StageContext):
    """layer_costs for one strategy, memoised: baselines and estimates re-score the same layers often."""
    key = (_nameless(ly), s, ctx.shape_key)
    hit = _COST_CACHE.get(key)
    if hit is None:
        if len(_COST_CACHE) > 200_000:
            _COST_CACHE.clear()
        lc = layer_costs(ly, [s], ctx)
        hit = (float(lc.cost[0]), float(lc.fwd[0]), float(lc.bwd[0]), float(lc.step[0]),
               float(lc.mem_states[0]), float(lc.mem_act[0]), ctx.cluster)
        _COST_CACHE[key] = hit
    return hit


def stage_cost(layers: list[LayerSpec], strategies: list[Strategy], ctx: StageContext,
               inflight: int) -> tuple[float, float, float, float, float]:
    """(cost per micro-batch, fwd, bwd, step, peak bytes per rank) of one stage.

    Summed in layer order exactly as the search's dynamic programme sums them.
    """
    cost = fwd = bwd = step = 0.0
    mem = 0.0
    transient = 0.0
    prev_layout = None
    for layer_idx, (ly, s) in enumerate(zip(layers, strategies)):
        c, f, b, st, ms, ma, _ = _one_layer_cost(ly, s, ctx)
        layout = (s.tp, s.sp)
        sw = 0.0
        if prev_layout is not None:
            sw = layout_switch_time(layers[layer_idx - 1].boundary_bytes, prev_layout, layout, ctx)
        cost = cost + (c + sw)
        mem = mem + (ms + inflight * ma)
        fwd += f + sw / 2
        bwd += b + sw / 2
        step += st
        transient = max(transient, transient_bytes(ly, ctx))
        prev_layout = layout
    peak = mem + transient + ctx.params.reserve_bytes
    return cost, fwd, bwd, step, peak


def stage_link(cluster: Cluster, src_devices: list[int], dst_devices: list[int]) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of the slowest link between two stages."""
    src_nodes = {cluster.node_of(d) for d in src_devices}
    dst_nodes = {cluster.node_of(d) for d in dst_devices}
    links = [cluster.node_link(a, b) for a in src_nodes for b in dst_nodes if a != b]
    for nd in src_nodes & dst_nodes:
        links.append((cluster.nodes[nd].intra_bw, cluster.nodes[nd].intra_lat_us * 1e-6))
    return min(links, key=lambda x: (x[0], -x[1]))


def boundary_p2p_time(cluster: Cluster, src_devices: list[int], dst_devices: list[int],
                      boundary_bytes: float, micro_batch_size: int) -> float:
    """One micro-batch's activations from one stage to the next, over the slowest link between them."""
    bw, lat = stage_link(cluster, src_devices, dst_devices)
    return float(comm.p2p_time(boundary_bytes * micro_batch_size, bw, lat))


def device_budget_bytes(cluster: Cluster, device: int, memory_budget_gib: float | None) -> float:
    """What a device may hold: its memory, or the user's cap when that is smaller."""
    cap = cluster.gpu_of(device).memory_bytes
    if memory_budget_gib is not None:
        cap = min(cap, memory_budget_gib * GIB)
    return cap


def pipeline_time(stages: list[StageEstimate], num_microbatches: int) -> float:
    """(m - 1) max_i c_i + sum_i (c_i + 2 p2p_i): summed in stage order like the search's partition DP."""
    total = 0.0
    for st in stages:
        total = total + (st.cost_per_microbatch_s + 2.0 * st.p2p_s)
    worst = max(st.cost_per_microbatch_s for st in stages)
    return (num_microbatches - 1) * worst + total


def estimate_pipeline(pipe: Pipeline, model: ModelSpec, cluster: Cluster, schedule: str,
                      params: CostParams) -> tuple[list[StageEstimate], float]:
    index = model.index()
    p = len(pipe.stages)
    out: list[StageEstimate] = []
    for i, st in enumerate(pipe.stages):
        try:
            layers = [model.layers[index[ly.name]] for ly in st.layers]
        except KeyError as e:
            raise AutoparError("plan.pipelines.stages.layers", f"unit {e.args[0]!r} is not in model {model.name}",
                               "search the plan again for this model") from None
        ctx = StageContext(cluster, tuple(st.devices), pipe.micro_batch_size, pipe.num_microbatches, params)
        k = inflight_microbatches(schedule, p, i, pipe.num_microbatches)
        cost, fwd, bwd, step, peak = stage_cost(layers, [ly.strategy for ly in st.layers], ctx, k)
        p2p = 0.0
        if i + 1 < p:
            p2p = boundary_p2p_time(cluster, st.devices, pipe.stages[i + 1].devices, layers[-1].boundary_bytes,
                                    pipe.micro_batch_size)
        out.append(StageEstimate(list(st.devices), [ly.name for ly in st.layers], cost, fwd, bwd, step, k, peak, p2p))
    return out, pipeline_time(out, pipe.num_microbatches)


def estimate_plan(plan: Plan, model: ModelSpec, params: CostParams | None = None) -> PlanEstimate:
    """Predicted figures of ``plan`` for ``model`` on the plan's own cluster."""
    params = params or CostParams()
    cluster = plan.cluster
    pipes, times = [], []
    for pipe in plan.pipelines:
        stages, t = estimate_pipeline(pipe, model, cluster, plan.schedule, params)
        pipes.append(stages)
        times.append(t)
    step = max(times)
    if len(plan.pipelines) > 1:
        from autopar.estimate.cross_pipeline import cross_pipeline_sync_time

        step = step + cross_pipeline_sync_time(plan, model, params, pipes, times)
    return finish_estimate(plan, model, pipes, times, step)


def finish_estimate(plan: Plan, model: ModelSpec, pipes: list[list[StageEstimate]], times: list[float],
                    step: float) -> PlanEstimate:
    """Throughput, MFU and per-device memory from the per-stage figures and the step time."""
    cluster = plan.cluster
    devices = plan.devices
    tokens = plan.global_batch_size * model.tokens_per_sample
    tokens_per_s = tokens / step
    flops_per_s = plan.global_batch_size * model.model_flops_per_sample / step
    peak_total = sum(cluster.gpu_of(d).flops for d in devices)
    mem = {d: st.memory_bytes / GIB for p in pipes for st in p for d in st.devices}
    budget = {d: device_budget_bytes(cluster, d, plan.memory_budget_gib) / GIB for d in devices}
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
