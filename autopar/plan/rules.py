"""The plan rules, written once: ``autopar validate`` (``validate_plan``) and the runtime (``wrap``'s
``check_plan``) apply these same functions, so one fault gives one message from both.

Each rule is a generator of problems ``(field, problem, fix)``, the parts of an ``AutoparError``.
Field paths name the Plan's own structure with every layer unit counted once
(``pipelines[0].stages[1].layers[2].tp`` is the third unit of that stage).

The rules see the model through ``ModelFacts`` (unit names in execution order and, per unit, whether
it has a TP plan and what a TP degree must divide), which a ``ModelSpec`` (``ModelFacts.of_spec``)
and the runtime's ``UnitTPInfo`` of an nn.Module (autopar/runtime/checks.py) both supply.

What is checked (each group only when its inputs are given):

* top: the schedule is known; global_batch_size, memory_budget_gib and every pipeline's counts are
  positive; ``batch_share == micro_batch_size * num_microbatches``; shares sum to the global batch;
  no pipeline or stage is empty; with a model that states one, the plan's sequence length is the model's;
* schedule: ``virtual_stages`` > 1 only with the interleaved schedule, which needs it >= 2 in every
  pipeline, at least 2 physical stages, a stage list of p * v chunks with chunk k on the devices of
  chunk k mod p, and num_microbatches a multiple of p (Megatron's constraint, the schedule table's);
  ``zb-h1`` needs 2+ stages and no unit with zero 3 or ckpt op (``zero_bubble_rules``);
* placement: each pipeline places every layer unit of the model exactly once, in model order,
  contiguously (stage k+1 starts where stage k ended), and ``plan.model.num_layers`` counts them;
  without a model, pipeline 0's units stand for the model's;
* devices: every device id inside the cluster, used exactly once in the whole plan, and every device
  of the cluster used (ranks are device ids); with a world, its size is the cluster's device count;
* per layer: tp is legal for the unit (it has a TP plan and tp divides each of its limits), async_tp only
  with tp > 1 and sp (the pair named), tp divides
  the stage's device count, each TP group sits inside one node, dp = devices / tp divides the
  micro-batch size; with a world that builds meshes, ZeRO-3 with 1 < tp < devices needs the stage's TP
  and DP groups to form one 2-D device mesh;
* experts (``expert_rules``): ep > 1 only on MoE units, dividing the unit's dp and its expert count,
  and not together with tp > 1 or cp > 1;
* context parallel (``cp_rules.py``): one cp per pipeline, tp x cp dividing the stage, the sequence in
  2 x cp chunks, no sp with cp;
* memory (with predicted peaks): each device's peak is within its budget (its GPU's memory less the
  ``memory_margin`` share, or ``memory_budget_gib`` where that is smaller).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain

from autopar.modelspec.spec import ModelSpec
from autopar.plan.cp_rules import cp_rules
from autopar.plan.expert_rules import expert_rules
from autopar.plan.schema import SCHEDULES, Plan

Problem = tuple[str, str, str]  # (field, problem, fix): the parts of an AutoparError
Problems = Iterator[Problem]

_EPS_GIB = 1e-9  # float noise in a caller's sum must not turn "exactly fits" into a rejection


@dataclass(frozen=True)
class UnitFacts:
    """What the rules need to know of one layer unit."""

    name: str
    has_tp_plan: bool = False  # False: the unit runs with tp = 1 only
    tp_divisors: tuple[int, ...] = ()  # a TP degree must divide each (heads, KV heads, FFN width, vocab)
    tp_needs_sp: bool = False  # parts run per token, whole on every rank (LayerSpec.tp_needs_sp): tp > 1 needs sp

    def tp_ok(self, tp: int) -> bool:
        """Whether TP degree ``tp`` is legal for this unit (1 always is)."""
        return tp == 1 or (self.has_tp_plan and all(d % tp == 0 for d in self.tp_divisors))


@dataclass(frozen=True)
class ModelFacts:
    """The model as the rules see it: its units in execution order (and its sequence length, if known)."""

    units: tuple[UnitFacts, ...]
    seq_len: int | None = None
    experts: Mapping[str, int] = field(default_factory=dict, hash=False)  # MoE unit -> routed experts (absent: dense)

    @classmethod
    def of_spec(cls, model: ModelSpec) -> ModelFacts:
        """The facts of a planner ModelSpec (a unit has a TP plan when it states TP divisors; its experts
        come from ``LayerSpec.moe``)."""
        return cls(tuple(UnitFacts(ly.name, ly.supports_tp, tuple(ly.tp_divisors), ly.tp_needs_sp)
                         for ly in model.layers), model.seq_len, model.num_experts)


@dataclass(frozen=True)
class WorldFacts:
    """The runtime's side: how many processes run the plan, and how it builds device meshes."""

    size: int
    # (stage devices in plan order, tp) -> whether the TP and DP groups form one 2-D device mesh;
    # None: the 2-D mesh rule is not applied.
    mesh_2d: Callable[[tuple[int, ...], int], bool] | None = None


def plan_rules(plan: Plan, model: ModelFacts | None = None, world: WorldFacts | None = None,
               memory_peak_gib: dict[int, float] | None = None) -> list[Problem]:
    """Every problem of ``plan``, in a fixed order (empty: the plan is valid)."""
    return list(chain(top_rules(plan, model), schedule_rules(plan), placement_rules(plan, model),
                      device_rules(plan, world),
                      cp_rules(plan), layer_rules(plan, model, world),
                      expert_rules(plan, model.experts if model is not None else None),
                      memory_rules(plan, memory_peak_gib) if memory_peak_gib else ()))


def _is_count(x: object, low: int = 1) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def top_rules(plan: Plan, model: ModelFacts | None) -> Problems:
    """Schedule, batch sizes, budget, empty pipelines / stages, and the model's size and sequence length."""
    if plan.schedule not in SCHEDULES:
        yield "schedule", f"unknown schedule {plan.schedule!r}", f"use one of {', '.join(SCHEDULES)}"
    if not _is_count(plan.global_batch_size):
        yield ("global_batch_size", f"must be a positive integer, got {plan.global_batch_size!r}",
               "give the number of samples per optimizer step")
    if plan.memory_budget_gib is not None and not plan.memory_budget_gib > 0:
        yield ("memory_budget_gib", f"must be positive, got {plan.memory_budget_gib}",
               "give GiB per device, or leave it unset to use each GPU's memory")
    if model is not None:
        if model.seq_len is not None and plan.model.seq_len != model.seq_len:
            yield ("model.seq_len", f"plan is for sequence length {plan.model.seq_len}, the model uses "
                   f"{model.seq_len}", "search with the same --seq-len, or rebuild the model with it")
    if not plan.pipelines:
        yield "pipelines", "is empty", "give at least one pipeline"
        return
    for pi, p in enumerate(plan.pipelines):
        at = f"pipelines[{pi}]"
        counts = {"batch_share": p.batch_share, "micro_batch_size": p.micro_batch_size,
                  "num_microbatches": p.num_microbatches}
        bad = [k for k, v in counts.items() if not _is_count(v)]
        for k in bad:
            yield f"{at}.{k}", f"must be a positive integer, got {counts[k]!r}", "give a count >= 1"
        if not bad and p.batch_share != p.micro_batch_size * p.num_microbatches:
            yield (f"{at}.batch_share", f"is {p.batch_share} but micro_batch_size x num_microbatches = "
                   f"{p.micro_batch_size} x {p.num_microbatches} = {p.micro_batch_size * p.num_microbatches}",
                   "make batch_share = micro_batch_size * num_microbatches")
        if not p.stages:
            yield f"{at}.stages", "is empty", "give the pipeline at least one stage"
        for si, st in enumerate(p.stages):
            if not st.devices:
                yield f"{at}.stages[{si}].devices", "is empty", "give the stage devices or remove the stage"
            if not st.layers:
                yield f"{at}.stages[{si}].layers", "is empty", "give the stage layer units or remove the stage"
    shares = [p.batch_share for p in plan.pipelines]
    if all(_is_count(s) for s in shares) and _is_count(plan.global_batch_size) and sum(shares) != plan.global_batch_size:
        yield ("pipelines[*].batch_share", f"shares {shares} sum to {sum(shares)}, not the global batch "
               f"{plan.global_batch_size}", "make the pipelines' batch shares add up to global_batch_size")


def schedule_rules(plan: Plan) -> Problems:
    """Virtual stages and the interleaved schedule: the combinations its table (``cost_models.pipeline_schedules``) has."""
    for pi, p in enumerate(plan.pipelines):
        at, v, n = f"pipelines[{pi}]", p.virtual_stages, len(p.stages)
        if not _is_count(v):
            yield f"{at}.virtual_stages", f"must be a positive integer, got {v!r}", "give 1, or 2+ with schedule: interleaved"
            continue
        if plan.schedule != "interleaved":
            if v > 1:
                yield (f"{at}.virtual_stages", f"virtual_stages {v} with schedule {plan.schedule}: only the interleaved "
                       "schedule runs several model chunks per stage", "set schedule: interleaved, or virtual_stages: 1")
            continue
        if v < 2:
            yield (f"{at}.virtual_stages", f"schedule interleaved with virtual_stages {v}: the interleaved schedule "
                   "needs 2 or more chunks per stage", "set virtual_stages: 2 or more, or schedule: 1f1b")
            continue
        if n % v:
            yield (f"{at}.stages", f"lists {n} chunks, not a multiple of virtual_stages {v}",
                   "list p * virtual_stages chunks, chunk k on the devices of chunk k mod p")
            continue
        ps = n // v
        if ps < 2:
            yield (f"{at}.virtual_stages", f"virtual_stages {v} on a single-stage pipeline: interleaving needs "
                   "2 or more pipeline stages", "use 2+ stages, or schedule: 1f1b with virtual_stages: 1")
            continue
        for k in range(ps, n):
            if list(p.stages[k].devices) != list(p.stages[k % ps].devices):
                yield (f"{at}.stages[{k}].devices", f"chunk {k} runs on {p.stages[k].devices}, not on the devices "
                       f"of chunk {k % ps} ({p.stages[k % ps].devices})",
                       f"give chunk k the devices of chunk k mod {ps} (the {ps} physical stages, in order)")
                break
        if _is_count(p.num_microbatches) and p.num_microbatches % ps:
            yield (f"{at}.num_microbatches", f"{p.num_microbatches} micro-batches with the interleaved schedule on "
                   f"{ps} stages: it needs a multiple of the stage count",
                   f"use a multiple of {ps} micro-batches, or schedule: 1f1b")
    yield from zero_bubble_rules(plan)


def zero_bubble_rules(plan: Plan) -> Problems:
    """``zb-h1``: two or more stages per pipeline, and none of the options its split backward cannot run
    (runtime/zero_bubble.py): ZeRO-3 (FSDP's reduce-scatter and reshard hooks fire once per backward, in
    B) and op-level checkpointing (torch's selective checkpoint allows one backward per region)."""
    if plan.schedule != "zb-h1":
        return
    for pi, p in enumerate(plan.pipelines):
        at = f"pipelines[{pi}]"
        if p.virtual_stages == 1 and len(p.stages) < 2:
            yield (f"{at}.stages", "schedule zb-h1 on a single-stage pipeline: zero bubble splits the backward "
                   "to fill a pipeline's bubble, and one stage has none", "use 2+ stages, or schedule: 1f1b")
        for si, st in enumerate(p.stages):
            for li, ly in enumerate(st.layers):
                for bad, why in ((ly.strategy.zero == 3, "zero 3"), (ly.strategy.ckpt == "op", "ckpt op")):
                    if bad:
                        yield (f"{at}.stages[{si}].layers[{li}]", f"schedule zb-h1 with {why} (unit {ly.name!r}): "
                               "the split backward (B then W) cannot run them together",
                               "use zero 0-2 and ckpt none/selective/full, or schedule: 1f1b")


def placement_rules(plan: Plan, model: ModelFacts | None) -> Problems:
    """Every pipeline places every unit once, in model order, stage after stage."""
    if not plan.pipelines:
        return
    if model is not None:
        reference, what = [u.name for u in model.units], "the model"
    else:
        reference = list(dict.fromkeys(n for st in plan.pipelines[0].stages for n in st.layer_names))
        what = "pipeline 0"
    order = {n: i for i, n in enumerate(reference)}
    for pi, p in enumerate(plan.pipelines):
        seen: dict[str, str] = {}
        prev: tuple[int, str] | None = None  # (model index, name) of the last unit placed
        for si, st in enumerate(p.stages):
            for li, ly in enumerate(st.layers):
                at = f"pipelines[{pi}].stages[{si}].layers[{li}]"
                if ly.name not in order:
                    yield (f"{at}.name", f"{ly.name!r} is not a layer unit of {what}",
                           f"use the unit names of {what} ({', '.join(reference[:3])}, ...)")
                    continue
                if ly.name in seen:
                    yield (f"{at}.name", f"{ly.name!r} is placed twice in pipeline {pi} (also at {seen[ly.name]})",
                           "place each layer unit exactly once per pipeline")
                    continue
                seen[ly.name] = at
                if prev is not None and order[ly.name] < prev[0]:
                    yield (f"{at}.name", f"{ly.name!r} comes after {prev[1]!r}, against model order",
                           "stages must hold consecutive units in model order, each stage continuing "
                           "where the previous one ended")
                prev = (order[ly.name], ly.name)
        missing = [n for n in reference if n not in seen]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            yield (f"pipelines[{pi}]", f"does not place layer unit(s) {', '.join(missing[:3])}{more}",
                   "add them to the stage that holds their neighbours, in model order")
    # The plan's unit count last: a misplaced unit explains a wrong count better than the count does.
    if plan.model.num_layers != len(reference) and model is not None:
        yield ("model.layers", f"plan says {plan.model.num_layers} layer units, the model has {len(reference)}",
               "search a plan for this model")
    elif plan.model.num_layers != len(reference):
        yield ("model.layers", f"is {plan.model.num_layers} but the plan places {len(reference)} distinct "
               "layer units", "place every unit of the model once per pipeline")


def device_rules(plan: Plan, world: WorldFacts | None) -> Problems:
    """Device ids inside the cluster, each used once, all used; the world is the cluster's size."""
    n = plan.cluster.num_devices
    first: dict[int, str] = {}
    for pi, p in enumerate(plan.pipelines):
        for si, st in enumerate(p.physical_stages):  # interleaved chunks repeat these (schedule_rules)
            for di, d in enumerate(st.devices):
                at = f"pipelines[{pi}].stages[{si}].devices[{di}]"
                if not _is_count(d, low=0) or d >= n:
                    yield (at, f"device {d!r} is outside the cluster (devices 0-{n - 1})",
                           f"use global device ids 0..{n - 1}, numbered node by node")
                elif d in first:
                    yield at, f"device {d} is used twice (also at {first[d]})", "give every device to exactly one stage"
                else:
                    first[d] = at
    unused = [d for d in range(n) if d not in first]
    if unused:
        yield ("pipelines", f"the plan uses {len(first)} of the cluster's {n} devices (unused: "
               f"{id_ranges(unused)}); ranks are device ids, so the world size must equal the cluster's devices",
               "place the unused devices in a stage, or remove their nodes from the cluster")
    if world is not None and world.size != n:
        yield ("world size", f"the plan's cluster has {n} device{'s' * (n != 1)} (one process each) but the world "
               f"has {world.size} processes", f"launch {n} process{'es' * (n != 1)}, or search a plan for "
               f"{world.size} devices")


def layer_rules(plan: Plan, model: ModelFacts | None, world: WorldFacts | None) -> Problems:
    """Per layer: tp legal for the unit, dividing the stage, inside one node; dp dividing the micro-batch."""
    n_dev = plan.cluster.num_devices
    units = {u.name: u for u in model.units} if model is not None else {}
    for pi, p in enumerate(plan.pipelines):
        for si, st in enumerate(p.stages):
            n = len(st.devices)
            in_cluster = n > 0 and all(_is_count(d, low=0) and d < n_dev for d in st.devices)
            for li, ly in enumerate(st.layers):
                at = f"pipelines[{pi}].stages[{si}].layers[{li}]"
                tp, unit = ly.strategy.tp, units.get(ly.name)
                if unit is not None and not unit.tp_ok(tp):
                    yield _illegal_tp(f"{at}.tp", tp, unit, n)
                elif tp > 1 and not ly.strategy.sp and ly.strategy.ep == 1 and unit is not None and (
                        unit.tp_needs_sp or ly.name in model.experts):  # with ep > 1: expert_rules' ep-with-tp
                    yield (f"{at}.sp", f"tp {tp} without sequence parallel on unit {ly.name!r}, whose experts (MoE) "
                           "run per token: sequence parallel divides their tokens over TP (Megatron-core's MoE layer "
                           "refuses TP without it too)", "set sp: true for this unit, or tp: 1")
                if ly.strategy.async_tp and not (tp > 1 and ly.strategy.sp):
                    yield (f"{at}.async_tp", f"async_tp with tp {tp} and sp {str(ly.strategy.sp).lower()}: async TP "
                           "micro-pipelines sequence parallelism's all-gathers and reduce-scatters, so it needs "
                           "tp > 1 with sp: true", "set async_tp: false, or tp >= 2 with sp: true")
                if n == 0:
                    continue
                if n % tp:
                    yield (f"{at}.tp", f"tp {tp} does not divide the stage's {n} devices",
                           f"use a divisor of {n} ({', '.join(str(t) for t in range(1, n + 1) if n % t == 0)})")
                    continue
                if in_cluster:
                    for g in st.tp_groups(tp):
                        nodes = sorted({plan.cluster.node_of(d) for d in g})
                        if len(nodes) > 1:
                            yield (f"{at}.tp", f"TP group {g} spans nodes {nodes}",
                                   "keep each TP group inside one node: a smaller tp, or reorder the stage's "
                                   "devices node by node")
                            break
                cp = ly.strategy.cp  # tp x cp not dividing the stage: cp_rules
                dp = n // tp // cp if (n // tp) % cp == 0 else n // tp
                per = f"tp {tp} x cp {cp}" if cp > 1 and (n // tp) % cp == 0 else f"tp {tp}"
                if _is_count(p.micro_batch_size) and p.micro_batch_size % dp:
                    yield (f"{at}.tp", f"dp = {n} devices / {per} = {dp} does not divide micro_batch_size "
                           f"{p.micro_batch_size} of pipeline {pi}",
                           f"make micro_batch_size a multiple of {dp}, or raise tp")
                if (world is not None and world.mesh_2d is not None and ly.strategy.zero == 3 and 1 < tp < n
                        and not world.mesh_2d(tuple(st.devices), tp)):
                    yield (f"pipelines[{pi}].stages[{si}].devices", f"zero 3 with tp {tp} (unit {ly.name!r}) needs "
                           "the stage's TP groups and DP groups to form a 2-D device mesh",
                           "list the stage's devices in increasing order")


def _illegal_tp(field: str, tp: int, unit: UnitFacts, n: int) -> Problem:
    """The problem of a TP degree the unit cannot run, naming the degrees it (and its stage) can."""
    if not unit.has_tp_plan:
        return (field, f"tp {tp} is not legal for unit {unit.name!r} (it has no TP plan)",
                "set tp: 1 for this unit, or search again with --max-tp 1")
    legal = [str(t) for t in range(1, max(n, 1) + 1) if (n == 0 or n % t == 0) and unit.tp_ok(t)]
    legal_text = legal[0] if len(legal) == 1 else f"{', '.join(legal[:-1])} or {legal[-1]}"
    return (field, f"tp {tp} is not legal for unit {unit.name!r} (its TP limits are {list(unit.tp_divisors)}; "
            "tp must divide each)", f"use tp {legal_text} (legal for the unit and dividing the stage's devices)")


def memory_rules(plan: Plan, peak_gib: dict[int, float]) -> Problems:
    """Each device's predicted peak within its budget (``Cluster.budget_gib``: its GPU's usable memory less
    memory_margin's share, or memory_budget_gib where that is smaller)."""
    where = {d: f"pipelines[{pi}].stages[{si}]" for pi, p in enumerate(plan.pipelines)
             for si, st in enumerate(p.stages) for d in st.devices}
    n = plan.cluster.num_devices
    for d in sorted(peak_gib):
        if not (_is_count(d, low=0) and d < n):
            yield f"memory (device {d!r})", "is not a device of the cluster", f"give predicted peaks for devices 0..{n - 1}"
            continue
        budget = plan.cluster.budget_gib(d, plan.memory_budget_gib)
        capped = plan.memory_budget_gib is not None and plan.memory_budget_gib <= budget
        margin = plan.cluster.memory_margin
        source = "memory_budget_gib" if capped else f"{plan.cluster.gpu_of(d).name} memory" + (
            f" less memory_margin {margin:g}" if margin else "")
        peak = float(peak_gib[d])
        if peak > budget + _EPS_GIB:
            yield (f"{where.get(d, 'plan')} (device {d})", f"predicted peak memory {peak:.2f} GiB exceeds the "
                   f"budget {budget:.2f} GiB ({source})", "raise zero or ckpt, lower micro_batch_size, or use more stages")


def id_ranges(ids: list[int], sep: str = ", ") -> str:
    """Consecutive runs compressed, in the given order: ``[0, 1, 2, 5]`` -> ``'0-2, 5'`` ('' when empty)."""
    parts, start = [], None
    for i, d in enumerate(ids):
        start = d if start is None else start
        if i + 1 == len(ids) or ids[i + 1] != d + 1:
            parts.append(f"{start}" if start == d else f"{start}-{d}")
            start = None
    return sep.join(parts)
