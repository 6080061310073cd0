"""The zero-bubble schedule's split backward (``zb-h1``): B computes only the stage input's gradient, W
later the parameters' gradients, over the same saved autograd graph.

B is ``torch.autograd.grad`` of the stage output (the loss on the last stage) with respect to the stage
input alone, ``retain_graph=True``: no parameter's ``.grad`` is touched, so no gradient hook (ZeRO-2's
reduce-scatter on landing, FSDP's) fires. W is ``torch.autograd.backward`` of the same output with the
same output gradient and ``inputs=`` the stage's parameters: gradients accumulate into ``.grad``
exactly as a plain backward would, and the graph is freed. Both passes are exact; W re-traverses the
input-gradient path the parameters' gradients flow through (torch's ``stage_backward_weight`` avoids
that by writing ``.grad`` itself, which skips the accumulate-grad hooks that gradient sync relies on).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from autopar.runtime.p2p import Exchange, Send


class StageRunner(Protocol):
    """What the split backward needs of ``stage.StageRunner`` (which imports this module)."""

    units: list[Any]  # LocalUnit: .module
    spec: Any  # StageSpec: .stage
    inputs: dict[int, torch.Tensor]
    outputs: dict[int, torch.Tensor]
    output_grads: dict[int, torch.Tensor | None]
    send_bwd: Exchange | None
    recv_bwd: Exchange | None

    def _loss_ctx(self) -> AbstractContextManager: ...

    def _boundary_tag(self, k: int, boundary: int, backward: bool) -> int: ...


def stage_params(runner: StageRunner) -> list[torch.Tensor]:
    """The parameters of the runner's units that take gradients, each once (tied weights are one tensor)."""
    seen: dict[int, torch.Tensor] = {}
    for u in runner.units:
        for p in u.module.parameters():
            if p.requires_grad:
                seen.setdefault(id(p), p)
    return list(seen.values())


def backward_input(runner: StageRunner, k: int, received: torch.Tensor | None) -> Send | None:
    """B of micro-batch ``k``: the gradient of the stage input, to send back; keeps the graph (and the
    output gradient) for ``backward_weight``."""
    out = runner.outputs[k]
    runner.output_grads[k] = received
    x = runner.inputs.get(k)
    if runner.send_bwd is None or x is None or not x.is_floating_point():
        return None
    grad = None
    if runner.recv_bwd is None:
        with runner._loss_ctx():
            (grad,) = torch.autograd.grad(out, x, retain_graph=True, allow_unused=True)
    elif received is not None and out.requires_grad:
        (grad,) = torch.autograd.grad(out, x, received, retain_graph=True, allow_unused=True)
    grad = grad if grad is not None else torch.zeros_like(x)
    return Send(grad, runner.send_bwd, runner._boundary_tag(k, runner.spec.stage - 1, True))


def backward_weight(runner: StageRunner, k: int) -> None:
    """W of micro-batch ``k``: accumulate the stage parameters' gradients from the graph B kept, then
    free it (and the micro-batch's saved input and output)."""
    out = runner.outputs.pop(k)
    received = runner.output_grads.pop(k)
    runner.inputs.pop(k, None)
    params = stage_params(runner)
    if not params:
        return
    if runner.recv_bwd is None:
        with runner._loss_ctx():
            torch.autograd.backward(out, inputs=params)
    elif received is not None and out.requires_grad:
        torch.autograd.backward(out, received, inputs=params)
