"""Refuse a plan that cannot run on this model and world, before any collective.

``check_plan`` applies the plan rules of ``autopar.plan.rules`` (the ones ``autopar validate``
applies, with the same messages) to the model's units and the world, including the runtime's own:
the world size is the plan's device count, and ZeRO-3 with TP needs a 2-D device mesh. Pure
functions of (plan, unit names, unit TP facts, world size): every rank reaches the same verdict, so
every rank raises the same one-line AutoparError and nobody waits on a peer that gave up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.models.tp_plans import MOE_LOCAL, entries
from autopar.plan.rules import ModelFacts, UnitFacts, WorldFacts, plan_rules
from autopar.plan.schema import Plan
from autopar.runtime.expert_parallel import num_experts, runtime_problems
from autopar.runtime.layout import Layout
from autopar.units import UnitTPInfo


def model_facts(unit_names: list[str], tp_info: dict[str, UnitTPInfo],
                experts: dict[str, int] | None = None) -> ModelFacts:
    """The rules' view of an nn.Module: its units in execution order with their TP plans and divisors, and
    the expert count of its MoE units (``unit_experts``)."""
    return ModelFacts(tuple(UnitFacts(n, tp_info[n].plan is not None, tuple(tp_info[n].divisors),
                                      any(style == MOE_LOCAL for _, style in entries(tp_info[n].plan or {})))
                            for n in unit_names), experts=dict(experts or {}))


def unit_experts(named_units: list[tuple[str, nn.Module]]) -> dict[str, int]:
    """Unit name -> its experts (packed experts modules, autopar.runtime.expert_parallel), MoE units only."""
    counts = {n: num_experts(m) for n, m in named_units}
    return {n: c for n, c in counts.items() if c}


def _mesh_2d(devices: tuple[int, ...], tp: int) -> bool:
    """Whether FSDP x TP can build its 2-D DeviceMesh over the stage's sorted process groups."""
    return Layout(devices, tp).fsdp_grid() is not None


def check_plan(plan: Plan, unit_names: list[str], tp_info: dict[str, UnitTPInfo], world_size: int,
               experts: dict[str, int] | None = None) -> None:
    """Raise AutoparError naming the first problem of ``plan`` on this model and world (the plan rules)."""
    problems = plan_rules(plan, model_facts(unit_names, tp_info, experts), WorldFacts(world_size, _mesh_2d))
    problems = problems or runtime_problems(plan)  # what expert parallel does not run here
    if problems:
        raise AutoparError(*problems[0])


def check_batchnorm(plan: Plan, named_units: list[tuple[str, nn.Module]]) -> None:
    """Refuse BatchNorm where its batch statistics would differ from single-process training.

    A BatchNorm normalises by its input batch's statistics and updates its running statistics once
    per forward: exact only when one forward sees the whole global batch, i.e. one pipeline, one
    micro-batch, and no recomputation (full / op checkpointing runs the forward twice). A unit with
    data-parallel degree > 1 takes its statistics over its DP group (runtime.sync_batchnorm), which
    then holds the whole batch; with several micro-batches no grouping of ranks would.
    """
    for name, unit in named_units:
        bn = next((f for f, m in unit.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)), None)
        if bn is None:
            continue
        where = f"{name}.{bn}" if bn else name
        for pi, pipe in enumerate(plan.pipelines):
            for si, st in enumerate(pipe.stages):
                li = next((i for i, ly in enumerate(st.layers) if ly.name == name), None)
                if li is None:
                    continue
                ly = st.layers[li]
                why = (f"{len(plan.pipelines)} pipelines share the batch" if len(plan.pipelines) > 1
                       else f"{pipe.num_microbatches} micro-batches" if pipe.num_microbatches > 1
                       else f"ckpt {ly.strategy.ckpt} runs its forward twice" if ly.strategy.ckpt in ("full", "op")
                       else None)
                if why:
                    raise AutoparError(
                        f"pipelines[{pi}].stages[{si}].layers[{li}]",
                        f"unit {name} has BatchNorm {where}, whose statistics would be taken over part of the "
                        f"batch ({why}), unlike single-process training",
                        "use GroupNorm or LayerNorm, or a plan with one pipeline, one micro-batch and no full/op "
                        "ckpt for that unit")


# The runtime trains in the model's own parameter dtype and casts nothing (no autocast, no Float8
# conversion): a plan's precision is what runs only when the model already is in it. bf16, the
# default (and what plans written before precisions existed mean), is accepted on any model: CPU
# runs train fp32 models under it, and its figures then describe bf16 mixed precision, not what runs.
PRECISION_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "fp16": (torch.float16,),
    "fp32": (torch.float32,),
    "tf32": (torch.float32,),  # its TF32 matmuls: the process's switch, which check_tf32 holds to the plan
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


def tf32_switch(allow_tf32: bool, env: Mapping[str, str]) -> bool:
    """Whether fp32 matmuls run as TF32 on a GPU that has it: PyTorch's switch (which NGC's images force on with
    TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1) unless NVIDIA_TF32_OVERRIDE=0 turns TF32 off inside cuBLAS."""
    return bool(allow_tf32) and env.get("NVIDIA_TF32_OVERRIDE") != "0"


def tf32_matmuls(device: torch.device) -> bool | None:
    """Whether this process runs fp32 matmuls on ``device`` as TF32; None where there is no TF32 (the CPU, GPUs
    before Ampere), so fp32 is plain FP32 whatever the switches say."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 8:
        return None
    return tf32_switch(torch.backends.cuda.matmul.allow_tf32, os.environ)


def check_tf32(precision: str, tf32: bool | None) -> None:
    """Refuse an fp32 plan where fp32 matmuls run as TF32 and a tf32 plan where they do not (one line): its estimate
    was priced at the other rate, several times apart. ``tf32``: ``tf32_matmuls`` of this rank's device."""
    if tf32 is None or precision not in ("fp32", "tf32") or tf32 == (precision == "tf32"):
        return
    if tf32:
        raise AutoparError("plan.precision", "is fp32 but this process runs fp32 matmuls as TF32 "
                           "(torch.backends.cuda.matmul.allow_tf32 is on; NGC's PyTorch images turn it on with "
                           "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1), several times faster than the plan was priced",
                           "set torch.backends.cuda.matmul.allow_tf32 = False (or NVIDIA_TF32_OVERRIDE=0; autopar "
                           "launch scripts do), or search the plan with --precision tf32")
    raise AutoparError("plan.precision", "is tf32 but this process runs fp32 matmuls in plain FP32 "
                       "(torch.backends.cuda.matmul.allow_tf32 is off, or NVIDIA_TF32_OVERRIDE=0), several times "
                       "slower than the plan was priced", "set torch.backends.cuda.matmul.allow_tf32 = True "
                       "(autopar launch scripts do), or search the plan with --precision fp32")
