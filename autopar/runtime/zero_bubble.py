"""The zero-bubble schedule's split backward (``zb-h1``): B computes only the stage input's gradient, W
later the parameters' gradients, over the same saved autograd graph.

B is ``torch.autograd.grad`` of the stage output (the loss on the last stage) with respect to the stage
input alone, ``retain_graph=True``; on the way it records the gradient reaching each *intermediate*,
a node on the input-gradient path that also feeds a parameter (torch's ``get_param_groups`` of
``torch.distributed.pipelining._backward`` finds them). No parameter's ``.grad`` is touched, so no
gradient hook (ZeRO-2's reduce-scatter on landing) fires in B. W restarts the backward from those
intermediates with the recorded gradients, ``torch.autograd.backward(edges, grads, inputs=params)``:
only the weight-gradient nodes run (the input-gradient path is not traversed again), and gradients
accumulate into ``.grad`` through the accumulate-grad nodes, hooks included, exactly as a plain backward
would (torch's own ``stage_backward_weight`` writes ``.grad`` itself, which skips those hooks). A stage
whose input carries no gradient (the first, fed token ids) has no B to run: its W is the whole
backward, ``torch.autograd.backward(output, inputs=params)``; so is any stage where a parameter is not
reached through an intermediate (not seen in the runtime's units, kept as a guard).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch.autograd.graph import GradientEdge, Node
from torch.distributed.pipelining._backward import (
    _get_grad_fn_or_grad_acc,
    construct_reverse_graph,
    get_param_groups,
)

from autopar.runtime.p2p import Exchange, Send


class StageRunner(Protocol):
    """What the split backward needs of ``stage.StageRunner`` (which imports this module)."""

    units: list[Any]  # LocalUnit: .module
    spec: Any  # StageSpec: .stage
    inputs: dict[int, torch.Tensor]
    outputs: dict[int, torch.Tensor]
    output_grads: dict[int, Any]  # micro-batch -> what W needs: the output gradient, or the recorded groups
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


class _Groups:
    """B's record for W: per parameter group, its intermediates, the gradients they received, its parameters."""

    def __init__(self, groups: list[dict], params: dict[Node, torch.Tensor]) -> None:
        self.groups, self.params = groups, params


def _param_groups(out: torch.Tensor, x: torch.Tensor, params: list[torch.Tensor]) -> _Groups | None:
    """torch's parameter groups of this graph, or None when some parameter in the graph is reached by none."""
    accs = {_get_grad_fn_or_grad_acc(p): p for p in params}
    reverse = construct_reverse_graph([out.grad_fn])
    groups = get_param_groups([_get_grad_fn_or_grad_acc(x)], list(accs), reverse)
    covered = set().union(*(g["params"] for g in groups)) if groups else set()
    if any(acc in reverse and acc not in covered for acc in accs):
        return None
    for g in groups:
        g["intermediates"] = list(g["intermediates"])
        g["grads"] = [None] * len(g["intermediates"])
    return _Groups(groups, accs)


def backward_input(runner: StageRunner, k: int, received: torch.Tensor | None) -> Send | None:
    """B of micro-batch ``k``: the gradient of the stage input, to send back; records for
    ``backward_weight`` what it needs (the graph is kept)."""
    out = runner.outputs[k]
    runner.output_grads[k] = received
    x = runner.inputs.get(k)
    if runner.send_bwd is None or x is None or not x.is_floating_point():
        return None
    grad = None
    last = runner.recv_bwd is None
    if last or (received is not None and out.requires_grad):
        groups = _param_groups(out, x, stage_params(runner)) if out.grad_fn is not None else None
        handles = []
        for g in groups.groups if groups is not None else []:
            for i, node in enumerate(g["intermediates"]):
                def record(grad_outputs, g=g, i=i):
                    g["grads"][i] = grad_outputs
                handles.append(node.register_prehook(record))
        try:
            with runner._loss_ctx():
                (grad,) = torch.autograd.grad(out, x, None if last else received, retain_graph=True,
                                              allow_unused=True)
        finally:
            for h in handles:
                h.remove()
        if groups is not None:
            runner.output_grads[k] = groups
    grad = grad if grad is not None else torch.zeros_like(x)
    return Send(grad, runner.send_bwd, runner._boundary_tag(k, runner.spec.stage - 1, True))


def _weights_from(groups: _Groups) -> None:
    """Accumulate each group's parameter gradients from its intermediates' recorded gradients."""
    for g in groups.groups:
        edges, grads = [], []
        for node, recorded in zip(g["intermediates"], g["grads"]):
            for i, gr in enumerate(recorded or ()):
                if gr is not None:
                    edges.append(GradientEdge(node, i))
                    grads.append(gr)
        if not edges:
            continue
        # An intermediate downstream of another would also receive what flows from it: pin each to its record.
        handles = [node.register_prehook(lambda _grads, rec=rec: rec)
                   for node, rec in zip(g["intermediates"], g["grads"]) if rec is not None]
        try:
            torch.autograd.backward(edges, grads, retain_graph=True, inputs=[groups.params[a] for a in g["params"]])
        finally:
            for h in handles:
                h.remove()


def backward_weight(runner: StageRunner, k: int) -> None:
    """W of micro-batch ``k``: accumulate the stage parameters' gradients (from B's record when it made
    one, else by the whole backward), then free the micro-batch's graph, input and output."""
    out = runner.outputs.pop(k)
    record = runner.output_grads.pop(k)
    runner.inputs.pop(k, None)
    if isinstance(record, _Groups):
        _weights_from(record)
        return
    params = stage_params(runner)
    if not params:
        return
    if runner.recv_bwd is None:
        with runner._loss_ctx():
            torch.autograd.backward(out, inputs=params)
    elif record is not None and out.requires_grad:
        torch.autograd.backward(out, record, inputs=params)
