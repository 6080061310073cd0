"""Refuse a plan that cannot run on this model and world, before any collective.

Pure functions of (plan, unit names, unit TP facts, world size): every rank reaches the same verdict,
so every rank raises the same one-line AutoparError and nobody waits on a peer that gave up.
"""

from __future__ import annotations

from torch import nn

from autopar.errors import AutoparError
from autopar.plan.schema import Plan
from autopar.runtime.layout import Layout
from autopar.units import UnitTPInfo


def check_plan(plan: Plan, unit_names: list[str], tp_info: dict[str, UnitTPInfo], world_size: int) -> None:
    """Raise AutoparError naming the first mismatch between ``plan``, the model's units and the world."""
    devices = plan.devices
    if len(devices) != world_size:
        raise AutoparError("pipelines.stages.devices", f"plan uses {len(devices)} devices but the world has "
                           f"{world_size} processes", f"launch {len(devices)} processes or search a plan for "
                           f"{world_size} devices")
    if sorted(devices) != list(range(world_size)):
        dup = sorted({d for d in devices if devices.count(d) > 1})
        what = f"devices {dup} appear more than once" if dup else f"devices are {sorted(devices)}"
        raise AutoparError("pipelines.stages.devices", f"{what}; each rank 0..{world_size - 1} must be in "
                           "exactly one stage", "list every device once across all stages")
    if not plan.pipelines:
        raise AutoparError("pipelines", "is empty", "give at least one pipeline")
    total = sum(p.batch_share for p in plan.pipelines)
    if total != plan.global_batch_size:
        raise AutoparError("pipelines.batch_share", f"shares sum to {total}, not global_batch_size "
                           f"{plan.global_batch_size}", "make the shares add up to the global batch")
    known = set(unit_names)
    for pi, pipe in enumerate(plan.pipelines):
        where = f"pipelines[{pi}]"
        if pipe.micro_batch_size < 1 or pipe.num_microbatches < 1:
            raise AutoparError(f"{where}.micro_batch_size", "micro_batch_size and num_microbatches must be >= 1",
                               "give positive values")
        if pipe.micro_batch_size * pipe.num_microbatches != pipe.batch_share:
            raise AutoparError(f"{where}.batch_share", f"{pipe.batch_share} != micro_batch_size "
                               f"{pipe.micro_batch_size} x num_microbatches {pipe.num_microbatches}",
                               "make batch_share = micro_batch_size * num_microbatches")
        if not pipe.stages:
            raise AutoparError(f"{where}.stages", "is empty", "give at least one stage")
        names = [ly.name for st in pipe.stages for ly in st.layers]
        for n in names:
            if n not in known:
                raise AutoparError(f"{where}.layers", f"unknown unit {n!r}",
                                   f"use the model's units: {', '.join(unit_names[:4])}, ...")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise AutoparError(f"{where}.layers", f"units {dup} are placed more than once in one pipeline",
                               "place every unit exactly once per pipeline")
        missing = [n for n in unit_names if n not in names]
        if missing:
            raise AutoparError(f"{where}.layers", f"units {missing[:4]} are not placed",
                               "every pipeline must hold every unit of the model")
        if names != unit_names:
            raise AutoparError(f"{where}.layers", "units are out of execution order",
                               "stages must hold consecutive units in model order")
        for si, st in enumerate(pipe.stages):
            _check_stage(f"{where}.stages[{si}]", st, pipe.micro_batch_size, tp_info)


def _check_stage(where: str, st, mbs: int, tp_info: dict[str, UnitTPInfo]) -> None:
    if not st.devices or not st.layers:
        raise AutoparError(where, "has no devices or no layers", "give every stage devices and layers")
    n = len(st.devices)
    for ly in st.layers:
        s, info = ly.strategy, tp_info[ly.name]
        field = f"{where}.layers.{ly.name}.tp"
        if s.tp > 1 and info.plan is None:
            raise AutoparError(field, f"unit {ly.name!r} has no tensor-parallel plan, so tp must be 1",
                               "set tp: 1 for this unit")
        bad = [d for d in info.divisors if d % s.tp]
        if bad:
            raise AutoparError(field, f"tp {s.tp} does not divide {bad} (heads / kv heads / ffn / vocab)",
                               f"use a tp that divides {list(info.divisors)}")
        if n % s.tp:
            raise AutoparError(field, f"tp {s.tp} does not divide the stage's {n} devices",
                               "use a tp that divides the stage size")
        dp = n // s.tp
        if mbs % dp:
            raise AutoparError(f"{where}.layers.{ly.name}", f"micro_batch_size {mbs} is not divisible by "
                               f"dp {dp} (= {n} devices / tp {s.tp})", "use a micro-batch size divisible by dp")
        if s.zero == 3 and 1 < s.tp < n and Layout(tuple(st.devices), s.tp).fsdp_grid() is None:
            raise AutoparError(f"{where}.devices", f"zero 3 with tp {s.tp} needs the stage's TP groups and DP "
                               "groups to form a 2-D device mesh", "list the stage's devices in increasing order")


def check_untied(named_units: list[tuple[str, nn.Module]]) -> None:
    """Refuse parameters shared by two units (tied embeddings): each unit's gradients are synced on their own."""
    owner: dict[int, str] = {}
    for name, unit in named_units:
        for fqn, p in unit.named_parameters(remove_duplicate=False):
            other = owner.setdefault(id(p), f"{name}.{fqn}")
            if not other.startswith(f"{name}."):
                raise AutoparError("model", f"{other} and {name}.{fqn} are the same tensor (tied weights across "
                                   "units)", "untie them (clone one) or keep both in one unit")
