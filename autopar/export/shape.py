"""The uniform plan every export target speaks: one strategy for all blocks, equal stages in the tool's rank order.

A ``Shape`` is what torchtitan, Megatron-LM, DeepSpeed and accelerate configure (pp x dp x tp, one
ZeRO level, one checkpoint mode, sequence parallel or not, the micro-batching, the layer split);
``build_plan`` turns it into a real autopar ``Plan`` on the original plan's cluster, so the same
validator and cost model judge it. ``describe`` summarises any plan field by field, and ``changes``
lists, one line each, where two plans differ: what an export prints and writes instead of approximating
silently.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autopar.modelspec.spec import LayerSpec, ModelSpec
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy


@dataclass(frozen=True)
class Shape:
    """A plan every unit of which runs the same way (see the module docstring).

    ``replicas``: identical pipelines (torchtitan's ``data_parallel_replicate_degree`` over a sharded
    stage: HSDP); ``split``: the unit indices of each stage, in order.
    """

    pp: int
    tp: int
    zero: int
    ckpt: str
    sp: bool
    num_microbatches: int
    split: tuple[tuple[int, ...], ...]
    replicas: int = 1
    schedule: str = "1f1b"
    ep: int = 1  # expert parallel degree of the MoE units (where it is legal for the unit)
    reshard: bool = True  # ZeRO-3 units: reshard after forward
    overlap: bool = False  # ZeRO-1/2 units: zero_overlap
    cp: int = 1  # context parallel degree (tp x cp x dp per stage, Megatron's order)
    async_tp: bool = False  # on the recomputed units (the blocks) that run sp with tp > 1

    def stage_devices(self, world: int) -> int:
        """Devices per stage on a world of ``world`` devices."""
        return world // (self.replicas * self.pp)

    def dp(self, world: int) -> int:
        """Data-parallel degree of a stage (within one replica)."""
        return self.stage_devices(world) // (self.tp * self.cp)


def recomputed(ly: LayerSpec, model: ModelSpec) -> bool:
    """Whether the tools' activation checkpointing wraps unit ``ly``: the transformer blocks (every
    unit of a model without blocks); embeddings and heads are never wrapped."""
    if any(u.kind == "block" for u in model.layers):
        return ly.kind == "block"
    return True


def unit_strategy(ly: LayerSpec, model: ModelSpec, shape: Shape, n: int) -> Strategy:
    """The strategy of unit ``ly`` on a stage of ``n`` devices: the shape's TP degree where the unit
    takes it (a unit without a TP plan, e.g. a norm, runs replicated), ZeRO where there is data parallelism."""
    tp = shape.tp if ly.tp_ok(shape.tp) else 1
    ckpt = shape.ckpt if recomputed(ly, model) else "none"
    if ckpt == "op" and ly.op is None:
        ckpt = "none"
    zero = shape.zero if n // tp > 1 else 0
    sp = shape.sp and tp > 1
    return Strategy(tp, zero, ckpt, sp, reshard=shape.reshard or zero != 3,
                    zero_overlap=shape.overlap and zero in (1, 2), ep=unit_ep(ly, shape.ep, tp, n // tp),
                    cp=shape.cp, async_tp=shape.async_tp and sp and recomputed(ly, model))


def unit_ep(ly: LayerSpec, ep: int, tp: int, dp: int) -> int:
    """``ep`` for an MoE unit that can take it (tp 1, ep dividing its dp and its experts), else 1."""
    ok = ly.moe is not None and tp == 1 and dp % ep == 0 and ly.moe.num_experts % ep == 0
    return ep if ok else 1


def build_plan(original: Plan, model: ModelSpec, shape: Shape) -> Plan:
    """The ``shape`` as an autopar Plan on ``original``'s cluster, devices, batch and budget. Devices
    follow the tools' rank order (pipeline stage slowest, then replica, data parallel, TP fastest)."""
    devices = sorted(original.devices)  # every device of the cluster (the plan rules), in rank order
    n = shape.stage_devices(len(devices))
    share = original.global_batch_size // shape.replicas
    pipes = []
    for r in range(shape.replicas):
        stages = []
        for s, idx in enumerate(shape.split):
            first = s * shape.replicas * n + r * n
            layers = [StageLayer(model.layers[i].name, unit_strategy(model.layers[i], model, shape, n)) for i in idx]
            stages.append(Stage(devices[first:first + n], layers))
        pipes.append(Pipeline(share, share // shape.num_microbatches, shape.num_microbatches, stages))
    ref = ModelRef(original.model.name, original.model.seq_len, original.model.num_layers, original.model.source)
    return Plan(ref, original.cluster, original.global_batch_size, pipes, schedule=shape.schedule,
                memory_budget_gib=original.memory_budget_gib, search=dict(original.search))


def even_split(model: ModelSpec, pp: int) -> tuple[tuple[int, ...], ...] | None:
    """Megatron's default split: the blocks evenly (earlier stages take the remainder), the units
    before the blocks on the first stage and those after them on the last; None when pp > blocks."""
    blocks = [i for i, ly in enumerate(model.layers) if ly.kind == "block"] or list(range(model.num_layers))
    nb = len(blocks)
    if pp > nb:
        return None
    sizes = [nb // pp + (1 if i < nb % pp else 0) for i in range(pp)]
    out, start = [], blocks[0]
    for i, size in enumerate(sizes):
        lo = 0 if i == 0 else start
        hi = model.num_layers if i == pp - 1 else start + size
        out.append(tuple(range(lo, hi)))
        start += size
    return tuple(out)


def _runs(values: list) -> str:
    """``[a, a, b]`` -> ``a x2, b``: a per-unit list in order, compressed."""
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return ", ".join(f"{v} x{c}" if c > 1 else str(v) for v, c in out)


def describe(plan: Plan) -> dict[str, str]:
    """The plan field by field as short text, for ``changes``: pipelines, stages, split, devices,
    tp/zero (with ``nr``: reshard false, ``ov``: zero_overlap, as ``Strategy.short``)/ckpt/sp/async tp/ep/cp per unit (pipeline 0's order; every pipeline's when they differ), micro-batching,
    schedule."""
    pipes = plan.pipelines

    def per_unit(key) -> str:
        texts = {_runs([key(ly.strategy) for st in p.stages for ly in st.layers]) for p in pipes}
        return texts.pop() if len(texts) == 1 else " / ".join(
            _runs([key(ly.strategy) for st in p.stages for ly in st.layers]) for p in pipes)

    return {
        "pipelines": f"{len(pipes)} ({', '.join(str(len(p.stages)) + ' stage(s)' for p in pipes)})",
        "devices per stage": " / ".join(",".join(str(len(st.devices)) for st in p.stages) for p in pipes),
        "units per stage": " / ".join(",".join(str(len(st.layers)) for st in p.stages) for p in pipes),
        "devices": " / ".join("; ".join(_span(st.devices) for st in p.stages) for p in pipes),
        "tp": per_unit(lambda s: s.tp),
        "zero": per_unit(lambda s: f"{s.zero}{'' if s.reshard else ' nr'}{' ov' if s.zero_overlap else ''}"),
        "ckpt": per_unit(lambda s: s.ckpt),
        "sp": per_unit(lambda s: "on" if s.sp else "off"),
        "ep": per_unit(lambda s: s.ep),
        "cp": per_unit(lambda s: s.cp),
        "async tp": per_unit(lambda s: "on" if s.async_tp else "off"),
        "micro-batches": " / ".join(f"{p.num_microbatches} of {p.micro_batch_size}" for p in pipes),
        "schedule": plan.schedule,
    }


def _span(devices: list[int]) -> str:
    if devices == list(range(devices[0], devices[0] + len(devices))):
        return f"{devices[0]}-{devices[-1]}" if len(devices) > 1 else str(devices[0])
    return ",".join(map(str, devices))


def changes(before: Plan, after: Plan) -> list[str]:
    """One line per field where ``after`` differs from ``before`` (``field: before -> after``)."""
    a, b = describe(before), describe(after)
    return [f"{k}: {a[k]} -> {b[k]}" for k in a if a[k] != b[k]]


def weighted_choice(plan: Plan, model: ModelSpec, key, blocks_only: bool = False):
    """The value of ``key(strategy)`` that covers the most parameters (FLOPs for parameter-free units)
    over the plan's units; ties go to the larger value. ``blocks_only``: count the recomputed units."""
    weight: Counter = Counter()
    by_name = {ly.name: ly for ly in model.layers}
    for st in plan.stages:
        for ly in st.layers:
            spec = by_name[ly.name]
            if blocks_only and not recomputed(spec, model):
                continue
            weight[key(ly.strategy)] += spec.params or spec.flops or 1
    return max(weight, key=lambda v: (weight[v], v)) if weight else None
