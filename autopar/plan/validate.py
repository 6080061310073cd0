"""The plan validator: everything a plan must satisfy before the runtime or a launcher touches it.

Field paths name the Plan's own structure with every layer unit counted once
(``pipelines[0].stages[1].layers[2].tp`` is the third unit of that stage), which is how the runtime
and the cost model see the plan. Problems are one line each: ``<field>: <problem>; <fix>``.

What is checked (``model`` and ``memory_peak_gib`` only when given):

* each pipeline places every layer unit of the model exactly once, in model order, contiguously
  (stage k+1 starts where stage k ended); without a model, every pipeline places the same units as
  pipeline 0 and their count is ``plan.model.num_layers``;
* no stage without devices or layers; every device id inside the cluster and used exactly once in
  the whole plan, and every device of the cluster used (ranks are device ids: world size = devices);
* per layer: tp divides the stage's device count, is legal for the unit (``LayerSpec.tp_ok``), and
  each TP group sits inside one node; dp = devices / tp divides the micro-batch size;
* per pipeline: ``batch_share == micro_batch_size * num_microbatches``; shares sum to the global batch;
* the schedule is known; each device's predicted peak memory is within its budget
  (``memory_budget_gib`` when set, else the device's own GPU memory).
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import SCHEDULES, Plan

_EPS_GIB = 1e-9  # float noise in a caller's sum must not turn "exactly fits" into a rejection

Problem = tuple[str, str, str]  # (field, problem, fix): the parts of an AutoparError


def plan_problems(plan: Plan, model: ModelSpec | None = None,
                  memory_peak_gib: dict[int, float] | None = None) -> list[str]:
    """Every problem of ``plan``, one line each (empty: the plan is valid)."""
    return [str(AutoparError(*p)) for p in _problems(plan, model, memory_peak_gib)]


def validate_plan(plan: Plan, model: ModelSpec | None = None,
                  memory_peak_gib: dict[int, float] | None = None) -> None:
    """Raise AutoparError naming the first problem of ``plan`` and its fix; return None when valid."""
    problems = _problems(plan, model, memory_peak_gib)
    if problems:
        raise AutoparError(*problems[0])


def _problems(plan: Plan, model: ModelSpec | None, memory_peak_gib: dict[int, float] | None) -> list[Problem]:
    out: list[Problem] = []
    _check_top(plan, model, out)
    _check_layer_placement(plan, model, out)
    _check_devices(plan, out)
    _check_strategies(plan, model, out)
    if memory_peak_gib:
        _check_memory(plan, memory_peak_gib, out)
    return out


def _is_count(x, low: int = 1) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _check_top(plan: Plan, model: ModelSpec | None, out: list[Problem]) -> None:
    if plan.schedule not in SCHEDULES:
        out.append(("schedule", f"unknown schedule {plan.schedule!r}", f"use one of {', '.join(SCHEDULES)}"))
    if not _is_count(plan.global_batch_size):
        out.append(("global_batch_size", f"must be a positive integer, got {plan.global_batch_size!r}",
                    "give the number of samples per optimizer step"))
    if plan.memory_budget_gib is not None and not plan.memory_budget_gib > 0:
        out.append(("memory_budget_gib", f"must be positive, got {plan.memory_budget_gib}",
                    "give GiB per device, or leave it unset to use each GPU's memory"))
    if model is not None:
        if plan.model.num_layers != model.num_layers:
            out.append(("model.layers", f"plan says {plan.model.num_layers} layer units, model {model.name} has "
                        f"{model.num_layers}", "search a plan for this model"))
        if plan.model.seq_len != model.seq_len:
            out.append(("model.seq_len", f"plan is for sequence length {plan.model.seq_len}, the model uses "
                        f"{model.seq_len}", "search with the same --seq-len, or rebuild the model with it"))
    if not plan.pipelines:
        out.append(("pipelines", "is empty", "give at least one pipeline"))
        return
    for pi, p in enumerate(plan.pipelines):
        at = f"pipelines[{pi}]"
        counts = {"batch_share": p.batch_share, "micro_batch_size": p.micro_batch_size,
                  "num_microbatches": p.num_microbatches}
        bad = [k for k, v in counts.items() if not _is_count(v)]
        for k in bad:
            out.append((f"{at}.{k}", f"must be a positive integer, got {counts[k]!r}", "give a count >= 1"))
        if not bad and p.batch_share != p.micro_batch_size * p.num_microbatches:
            out.append((f"{at}.batch_share", f"is {p.batch_share} but micro_batch_size x num_microbatches = "
                        f"{p.micro_batch_size} x {p.num_microbatches} = {p.micro_batch_size * p.num_microbatches}",
                        "make batch_share = micro_batch_size * num_microbatches"))
        if not p.stages:
            out.append((f"{at}.stages", "is empty", "give the pipeline at least one stage"))
        for si, st in enumerate(p.stages):
            if not st.devices:
                out.append((f"{at}.stages[{si}].devices", "is empty", "give the stage devices or remove the stage"))
            if not st.layers:
                out.append((f"{at}.stages[{si}].layers", "is empty",
                            "give the stage layer units or remove the stage"))
    shares = [p.batch_share for p in plan.pipelines]
    if all(_is_count(s) for s in shares) and _is_count(plan.global_batch_size) and sum(shares) != plan.global_batch_size:
        out.append(("pipelines[*].batch_share", f"shares {shares} sum to {sum(shares)}, not the global batch "
                    f"{plan.global_batch_size}", "make the pipelines' batch shares add up to global_batch_size"))


def _check_layer_placement(plan: Plan, model: ModelSpec | None, out: list[Problem]) -> None:
    if not plan.pipelines:
        return
    if model is not None:
        reference, what = [ly.name for ly in model.layers], f"model {model.name}"
    else:
        reference = list(dict.fromkeys(n for st in plan.pipelines[0].stages for n in st.layer_names))
        what = "pipeline 0"
        if len(reference) != plan.model.num_layers:
            out.append(("model.layers", f"is {plan.model.num_layers} but the plan places {len(reference)} distinct "
                        "layer units", "place every unit of the model once per pipeline"))
    order = {n: i for i, n in enumerate(reference)}
    for pi, p in enumerate(plan.pipelines):
        seen: dict[str, str] = {}
        prev: tuple[int, str] | None = None  # (model index, name) of the last unit placed
        for si, st in enumerate(p.stages):
            for li, ly in enumerate(st.layers):
                at = f"pipelines[{pi}].stages[{si}].layers[{li}]"
                if ly.name not in order:
                    out.append((f"{at}.name", f"{ly.name!r} is not a layer unit of {what}",
                                f"use the unit names of {what} ({', '.join(reference[:3])}, ...)"))
                    continue
                if ly.name in seen:
                    out.append((f"{at}.name", f"{ly.name!r} is placed twice in pipeline {pi} (also at {seen[ly.name]})",
                                "place each layer unit exactly once per pipeline"))
                    continue
                seen[ly.name] = at
                if prev is not None and order[ly.name] < prev[0]:
                    out.append((f"{at}.name", f"{ly.name!r} comes after {prev[1]!r}, against model order",
                                "stages must hold consecutive units in model order, each stage continuing "
                                "where the previous one ended"))
                prev = (order[ly.name], ly.name)
        missing = [n for n in reference if n not in seen]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            out.append((f"pipelines[{pi}]", f"does not place layer unit(s) {', '.join(missing[:3])}{more}",
                        "add them to the stage that holds their neighbours, in model order"))


def _check_devices(plan: Plan, out: list[Problem]) -> None:
    n = plan.cluster.num_devices
    first: dict[int, str] = {}
    for pi, p in enumerate(plan.pipelines):
        for si, st in enumerate(p.stages):
            for di, d in enumerate(st.devices):
                at = f"pipelines[{pi}].stages[{si}].devices[{di}]"
                if not _is_count(d, low=0) or d >= n:
                    out.append((at, f"device {d!r} is outside the cluster (devices 0-{n - 1})",
                                f"use global device ids 0..{n - 1}, numbered node by node"))
                elif d in first:
                    out.append((at, f"device {d} is used twice (also at {first[d]})",
                                "give every device to exactly one stage"))
                else:
                    first[d] = at
    unused = [d for d in range(n) if d not in first]
    if unused:
        out.append(("pipelines", f"the plan uses {len(first)} of the cluster's {n} devices (unused: "
                    f"{_ranges(unused)}); ranks are device ids, so the world size must equal the cluster's devices",
                    "place the unused devices in a stage, or remove their nodes from the cluster"))


def _check_strategies(plan: Plan, model: ModelSpec | None, out: list[Problem]) -> None:
    n_dev = plan.cluster.num_devices
    specs = {ly.name: ly for ly in model.layers} if model is not None else {}
    for pi, p in enumerate(plan.pipelines):
        for si, st in enumerate(p.stages):
            n = len(st.devices)
            in_cluster = n > 0 and all(_is_count(d, low=0) and d < n_dev for d in st.devices)
            for li, ly in enumerate(st.layers):
                at = f"pipelines[{pi}].stages[{si}].layers[{li}]"
                tp = ly.strategy.tp
                spec = specs.get(ly.name)
                if spec is not None and not spec.tp_ok(tp):
                    limits = f"its TP limits are {list(spec.tp_divisors)}" if spec.supports_tp else "it has no TP plan"
                    out.append((f"{at}.tp", f"tp {tp} is not legal for unit {ly.name!r} ({limits})",
                                "use a tp that divides every limit, or tp 1"))
                if n == 0:
                    continue
                if n % tp:
                    out.append((f"{at}.tp", f"tp {tp} does not divide the stage's {n} devices",
                                f"use a divisor of {n} ({', '.join(str(t) for t in range(1, n + 1) if n % t == 0)})"))
                    continue
                if in_cluster:
                    for g in st.tp_groups(tp):
                        nodes = sorted({plan.cluster.node_of(d) for d in g})
                        if len(nodes) > 1:
                            out.append((f"{at}.tp", f"TP group {g} spans nodes {nodes}",
                                        "keep each TP group inside one node: a smaller tp, or reorder the stage's "
                                        "devices node by node"))
                            break
                dp = n // tp
                if _is_count(p.micro_batch_size) and p.micro_batch_size % dp:
                    out.append((f"{at}.tp", f"dp = {n} devices / tp {tp} = {dp} does not divide micro_batch_size "
                                f"{p.micro_batch_size} of pipeline {pi}",
                                f"make micro_batch_size a multiple of {dp}, or raise tp"))


def _check_memory(plan: Plan, peak_gib: dict[int, float], out: list[Problem]) -> None:
    where = {d: f"pipelines[{pi}].stages[{si}]" for pi, p in enumerate(plan.pipelines)
             for si, st in enumerate(p.stages) for d in st.devices}
    n = plan.cluster.num_devices
    for d in sorted(peak_gib):
        if not (_is_count(d, low=0) and d < n):
            out.append((f"memory (device {d!r})", "is not a device of the cluster",
                        f"give predicted peaks for devices 0..{n - 1}"))
            continue
        budget = plan.memory_budget_gib if plan.memory_budget_gib is not None else plan.cluster.gpu_of(d).memory_gib
        source = "memory_budget_gib" if plan.memory_budget_gib is not None else f"{plan.cluster.gpu_of(d).name} memory"
        peak = float(peak_gib[d])
        if peak > budget + _EPS_GIB:
            out.append((f"{where.get(d, 'plan')} (device {d})", f"predicted peak memory {peak:.2f} GiB exceeds the "
                        f"budget {budget:.2f} GiB ({source})",
                        "raise zero or ckpt, lower micro_batch_size, or use more stages"))


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], ids[0]
    for a, b in zip(ids, ids[1:] + [None]):
        if b != a + 1:
            parts.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return ", ".join(parts)
