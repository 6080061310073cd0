"""Mixed precision as FSDP2's ``MixedPrecisionPolicy`` says, on every unit whatever its strategy.

``wrap(..., mixed_precision=MixedPrecisionPolicy(param_dtype=torch.bfloat16))``:

- the model's own parameters stay in their dtype (fp32): they are the master weights the optimizer
  updates (ZeRO-1/2 slices and FSDP shards included);
- ``param_dtype``: each unit computes with its parameters cast to it (a differentiable cast in the
  unit's forward, inside activation checkpointing so a recomputation casts again; ZeRO-3 units use
  FSDP2's own policy, which casts before the all-gather); with ``cast_forward_inputs`` (default)
  the unit's floating inputs are cast too, so boundaries between units and stages travel in it;
- ``reduce_dtype``: gradients come back through the cast in the master dtype and are accumulated
  over micro-batches and reduced across ranks in it. Only the master dtype is supported (None means
  it); FSDP2 gets it explicitly, since its own default would reduce in ``param_dtype``;
- ``output_dtype``: the dtype of the model's output handed to the loss and returned by ``predict``
  (the last unit's output); None leaves it in ``param_dtype``.

The single-process equivalent is the model run with every parameter cast to ``param_dtype``
(``torch.func.functional_call``), floating inputs cast, the output cast to ``output_dtype``,
gradients landing on the fp32 parameters. Results agree to bf16 rounding, not bit for bit: the
ranks split matmuls and micro-batches differently (tests/runtime/test_api_precision.py states it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._pytree import tree_map

from autopar.errors import AutoparError

PLAN_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_policy(policy: MixedPrecisionPolicy | None, model: nn.Module, plan_precision: str) -> None:
    """Refuse a policy the runtime cannot run on this model and plan (one line, before any collective)."""
    if policy is None:
        return
    if not isinstance(policy, MixedPrecisionPolicy):
        raise AutoparError("mixed_precision", f"is a {type(policy).__name__}",
                           "pass torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16)")
    masters = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(masters) > 1:
        raise AutoparError("mixed_precision", f"the model's parameters have several dtypes ({sorted(map(str, masters))})",
                           "keep the master weights in one dtype (model.float())")
    master = next(iter(masters), torch.float32)
    if policy.reduce_dtype not in (None, master):
        raise AutoparError("mixed_precision.reduce_dtype", f"is {policy.reduce_dtype}; gradients are accumulated and "
                           f"reduced in the master weights' dtype {master}", "leave reduce_dtype None or set it to "
                           f"{master}")
    planned = PLAN_DTYPES.get(plan_precision)
    if policy.param_dtype is not None and planned is not None and plan_precision != "bf16" \
            and policy.param_dtype != planned:
        raise AutoparError("mixed_precision.param_dtype", f"is {policy.param_dtype} but the plan was searched for "
                           f"{plan_precision}", f"search the plan with --precision matching {policy.param_dtype}")


def fsdp_policy(policy: MixedPrecisionPolicy, master: torch.dtype, last: bool) -> MixedPrecisionPolicy:
    """FSDP2's policy for one ZeRO-3 unit: reduce in the master dtype; output dtype only on the last unit."""
    return MixedPrecisionPolicy(param_dtype=policy.param_dtype, reduce_dtype=master,
                                output_dtype=policy.output_dtype if last else None,
                                cast_forward_inputs=policy.cast_forward_inputs)


def _cast_floats(dtype: torch.dtype | None) -> Callable:
    def cast(x):
        return x.to(dtype) if dtype is not None and isinstance(x, torch.Tensor) and x.is_floating_point() else x

    return cast


def apply_cast(unit: nn.Module, policy: MixedPrecisionPolicy, last: bool) -> None:
    """Make ``unit``'s forward compute in ``policy.param_dtype`` (in place; parameters stay the masters)."""
    forward = unit.forward
    to_param, to_output = _cast_floats(policy.param_dtype), _cast_floats(policy.output_dtype if last else None)

    def run(*args, **kwargs):
        if policy.cast_forward_inputs:
            args, kwargs = tree_map(to_param, (args, kwargs))
        casted = {fqn: to_param(p) for fqn, p in unit.named_parameters()}
        with _reparametrize_module(unit, casted):
            out = forward(*args, **kwargs)
        return tree_map(to_output, out)

    unit.forward = run
