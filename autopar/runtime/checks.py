"""Refuse a plan that cannot run on this model and world, before any collective.

``check_plan`` applies the plan rules of ``autopar.plan.rules`` (the ones ``autopar validate``
applies, with the same messages) to the model's units and the world, including the runtime's own:
the world size is the plan's device count, and ZeRO-3 with TP needs a 2-D device mesh. Pure
functions of (plan, unit names, unit TP facts, world size): every rank reaches the same verdict, so
every rank raises the same one-line AutoparError and nobody waits on a peer that gave up.
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.plan.rules import ModelFacts, UnitFacts, WorldFacts, plan_rules
from autopar.plan.schema import Plan
from autopar.runtime.layout import Layout
from autopar.units import UnitTPInfo


def model_facts(unit_names: list[str], tp_info: dict[str, UnitTPInfo]) -> ModelFacts:
    """The rules' view of an nn.Module: its units in execution order with their TP plans and divisors."""
    return ModelFacts(tuple(UnitFacts(n, tp_info[n].plan is not None, tuple(tp_info[n].divisors))
                            for n in unit_names))


def _mesh_2d(devices: tuple[int, ...], tp: int) -> bool:
    """Whether FSDP x TP can build its 2-D DeviceMesh over the stage's sorted process groups."""
    return Layout(devices, tp).fsdp_grid() is not None


def check_plan(plan: Plan, unit_names: list[str], tp_info: dict[str, UnitTPInfo], world_size: int) -> None:
    """Raise AutoparError naming the first problem of ``plan`` on this model and world (the plan rules)."""
    problems = plan_rules(plan, model_facts(unit_names, tp_info), WorldFacts(world_size, _mesh_2d))
    if problems:
        raise AutoparError(*problems[0])


def check_untied(named_units: list[tuple[str, nn.Module]]) -> None:
    """Refuse parameters shared by two units (tied embeddings): each unit's gradients are synced on their own."""
    owner: dict[int, str] = {}
    for name, unit in named_units:
        for fqn, p in unit.named_parameters(remove_duplicate=False):
            other = owner.setdefault(id(p), f"{name}.{fqn}")
            if not other.startswith(f"{name}."):
                raise AutoparError("model", f"{other} and {name}.{fqn} are the same tensor (tied weights across "
                                   "units)", "untie them (clone one) or keep both in one unit")


# The runtime trains in the model's own parameter dtype and casts nothing (no autocast, no Float8
# conversion): a plan's precision is what runs only when the model already is in it. bf16, the
# default (and what plans written before precisions existed mean), is accepted on any model: CPU
# runs train fp32 models under it, and its figures then describe bf16 mixed precision, not what runs.
PRECISION_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "fp16": (torch.float16,),
    "fp32": (torch.float32,),
    "tf32": (torch.float32,),  # TF32 GEMMs are the caller's switch: torch.backends.cuda.matmul.allow_tf32
    "fp8": (torch.bfloat16, torch.float32),  # with torchao Float8Linear layers (checked by class name)
}


def check_precision(plan: Plan, named_units: list[tuple[str, nn.Module]]) -> None:
    """Refuse a plan whose precision is not what the runtime would run on this model (one line)."""
    allowed = PRECISION_DTYPES.get(plan.precision)
    if allowed is None:
        return
    modules = [m for _, unit in named_units for m in unit.modules()]
    found = {p.dtype for m in modules for p in m.parameters(recurse=False) if p.is_floating_point()}
    bad = sorted(str(d) for d in found - set(allowed))
    if bad:
        raise AutoparError("plan.precision", f"is {plan.precision} but the model's parameters are {', '.join(bad)} "
                           "(wrap trains in the model's own dtype)",
                           f"convert the model (e.g. model.to({allowed[0]})) or search the plan for its dtype")
    if plan.precision == "fp8" and not any(type(m).__name__ == "Float8Linear" for m in modules):
        raise AutoparError("plan.precision", "is fp8 but the model has no Float8Linear layers (wrap converts none)",
                           "convert the linear layers with torchao (convert_to_float8_training) first, or "
                           "search the plan with --precision bf16")
