"""One rank's pipeline stage: run its units on micro-batches, exchange boundaries, follow the schedule.

A unit's boundary tensors are local tensors of the rows its layout gives this rank (see layout.py),
full sequence, replicated over the unit's TP group. Between two units of the stage with different
TP degrees the rows are re-spread (``reshard``); between stages they travel by ``Mailbox.post``.
Each micro-batch's loss is scaled so that the pieces of all micro-batches, pipelines and DP ranks
add up to the single-process loss of the global batch (autopar.runtime.loss: the token cross entropy
over the global count of valid tokens; a user loss by its rows' share), and so do their gradients.

Every plan, symmetric or not, runs through this one executor rather than
``torch.distributed.pipelining`` for the symmetric ones: ``PipelineStage`` wants the same group
layout on every stage and one tensor from one peer per boundary, while a plan's stages may differ in
size and TP degree and change TP degree between units; a second executor for the easy case would
double what has to be proven equal to single-device training.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from autopar.plan.schema import Strategy
from autopar.runtime.boundaries import BoundaryCheck
from autopar.runtime.context_parallel import split_sequence
from autopar.runtime.layout import Layout
from autopar.runtime.loss import cross_entropy as cross_entropy  # re-exported: wrap's default loss
from autopar.runtime.loss import step_loss
from autopar.runtime.p2p import Exchange, Mailbox, Recv, Send, reshard
from autopar.runtime.schedule import Action, stage_slots
from autopar.runtime.zero_bubble import backward_input, backward_weight


@dataclass
class LocalUnit:
    name: str
    module: nn.Module
    layout: Layout
    strategy: Strategy


@dataclass(frozen=True)
class StageSpec:
    """Where this rank's stage sits: its pipeline's batch block, its neighbours' boundary layouts."""

    pipeline: int
    stage: int
    num_stages: int
    micro_batch_size: int
    num_microbatches: int
    batch_offset: int  # first global-batch row of this pipeline
    global_batch: int
    prev_layout: Layout | None  # last unit of the previous stage
    next_layout: Layout | None  # first unit of the next stage


class StageRunner:
    """Forward and backward of one stage for every micro-batch of a step, in schedule order."""

    def __init__(self, rank: int, units: list[LocalUnit], spec: StageSpec, schedule: str, mailbox: Mailbox,
                 loss_fn: Callable, logits_sharded: bool, boundary_check: BoundaryCheck | None = None,
                 slots: list[list[Action]] | None = None) -> None:
        self.rank, self.units, self.spec, self.mailbox = rank, units, spec, mailbox
        self.boundary_check = boundary_check  # packs tuple / dict boundaries; refuses what cannot cross
        self.loss_fn, self.logits_sharded = loss_fn, logits_sharded
        self.loss = step_loss(loss_fn)  # splits the global-batch loss exactly over micro-batches and ranks
        # ``slots``: given (empty) for a chunk of an interleaved stage, which ChunkedRunner drives (chunks.py).
        self.slots = slots if slots is not None else stage_slots(schedule, spec.num_stages, spec.stage,
                                                                   spec.num_microbatches)
        mbs = spec.micro_batch_size
        first, last = units[0].layout, units[-1].layout
        self.recv_fwd = self.send_bwd = self.send_fwd = self.recv_bwd = None
        if spec.prev_layout is not None:
            self.recv_fwd = Exchange.between(spec.prev_layout, first, mbs, rank)
            self.send_bwd = Exchange.between(first, spec.prev_layout, mbs, rank)
        if spec.next_layout is not None:
            self.send_fwd = Exchange.between(last, spec.next_layout, mbs, rank)
            self.recv_bwd = Exchange.between(spec.next_layout, last, mbs, rank)
        self.reshards: list[tuple[Exchange, Exchange] | None] = [None]
        for a, b in zip(units, units[1:]):
            same = a.layout == b.layout
            self.reshards.append(None if same else (Exchange.between(a.layout, b.layout, mbs, rank),
                                                    Exchange.between(b.layout, a.layout, mbs, rank)))
        self.fsdp_modules = [u.module for u in units if isinstance(u.module, FSDPModule)]
        # Only one member of the last unit's TP group reports the loss (the others hold copies).
        self.reports_loss = spec.next_layout is None and last.tp_coord(rank) == 0

    # -- tags: unique per message kind within a step ----------------------------------------
    def _boundary_tag(self, k: int, boundary: int, backward: bool) -> int:
        return (k * self.spec.num_stages + boundary) * 2 + int(backward)

    def _reshard_tag(self, k: int, i: int) -> int:
        base = 2 * self.spec.num_microbatches * self.spec.num_stages
        return base + k * len(self.units) + i

    def _rows(self, layout: Layout, k: int) -> slice:
        lo, hi = layout.my_rows(self.rank, self.spec.micro_batch_size)
        start = self.spec.batch_offset + k * self.spec.micro_batch_size
        return slice(start + lo, start + hi)

    def _loss_ctx(self):
        return loss_parallel() if self.logits_sharded else contextlib.nullcontext()

    # -- one micro-batch --------------------------------------------------------------------
    def forward(self, k: int, inputs: torch.Tensor, targets: torch.Tensor, received: torch.Tensor | None,
                ) -> Send | None:
        """Run micro-batch ``k`` through the stage; return what to send to the next stage."""
        spec = self.spec
        if self.recv_fwd is None:
            first = self.units[0].layout
            x = split_sequence(inputs[self._rows(first, k)], first.cp, first.cp_index(self.rank))
        else:
            x = received
            if x.is_floating_point():
                x.requires_grad_(True)
            self.inputs[k] = x
        check = self.boundary_check
        for i, unit in enumerate(self.units):
            if self.reshards[i] is not None:
                fwd, bwd = self.reshards[i]
                x = reshard(x, self.mailbox, fwd, bwd, self._reshard_tag(k, i))
            x = unit.module(x if check is None else check.unpack(unit.name, x))
            if check is not None:  # a tuple / dict crossing ranks travels packed as one tensor
                x = check.pack(unit.name, x)
        if self.send_fwd is not None:
            self.outputs[k] = x
            return Send(x.detach(), self.send_fwd, self._boundary_tag(k, spec.stage, False), header=k == 0)
        if targets is None:  # forward-only prediction: keep the output rows, no loss
            self.outputs[k] = x
            return None
        last = self.units[-1].layout
        rows = self._rows(last, k)
        target = split_sequence(targets[rows], last.cp, last.cp_index(self.rank))  # cp: this rank's tokens
        with self._loss_ctx():
            loss = self.loss(x, target, rows.stop - rows.start, spec.global_batch)
        self.outputs[k] = loss
        if self.reports_loss:
            value = loss.detach()
            self.loss_sum += value.to_local() if isinstance(value, DTensor) else value
        return None

    def backward(self, k: int, received: torch.Tensor | None) -> Send | None:
        """Backward of micro-batch ``k`` (``received``: the gradient of its output); return what to send back."""
        out = self.outputs.pop(k)
        if self.recv_bwd is None:
            with self._loss_ctx():
                out.backward()
        elif received is not None and out.requires_grad:
            torch.autograd.backward(out, received)
        x = self.inputs.pop(k, None)
        if self.send_bwd is None or x is None or not x.is_floating_point():
            return None
        grad = x.grad if x.grad is not None else torch.zeros_like(x)
        return Send(grad, self.send_bwd, self._boundary_tag(k, self.spec.stage - 1, True))

    def _recv_for(self, action: Action) -> Recv | None:
        """What ``action`` (of this runner's chunk) needs from a neighbouring stage before it can run."""
        kind, k, _ = action
        if kind == "F" and self.recv_fwd is not None:
            return Recv(self.recv_fwd, self._boundary_tag(k, self.spec.stage - 1, False),
                        cache_key=("act", self.spec.stage))
        if kind == "B" and self.recv_bwd is not None and self.outputs[k].is_floating_point():
            return Recv(self.recv_bwd, self._boundary_tag(k, self.spec.stage, True), like=self.outputs[k])
        return None

    def start_step(self, device: torch.device, targets: torch.Tensor | None) -> None:
        """Forget the previous step's micro-batches and loss; count this batch's valid targets."""
        self.inputs: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.output_grads: dict[int, torch.Tensor | None] = {}  # zb-h1: kept from B for W (zero_bubble.py)
        self.loss_sum = torch.zeros((), device=device)
        if targets is not None:
            self.loss.begin(targets)

    # -- a whole step -----------------------------------------------------------------------
    def run(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Run the schedule over this pipeline's micro-batches; return this rank's weighted loss sum."""
        return run_slots([self], self.slots, self.mailbox, inputs, targets)

    @torch.no_grad()
    def run_forward(self, inputs: torch.Tensor, targets: torch.Tensor | None,
                    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Forward only, no autograd graph: every micro-batch in order (GPipe's forward half).

        Returns this rank's weighted loss sum (zero without ``targets``) and, on the last stage
        without ``targets``, the last unit's output rows by micro-batch (empty elsewhere).
        """
        forwards = [[("F", k, 0)] for k in range(self.spec.num_microbatches)]  # one action per slot
        run_slots([self], forwards, self.mailbox, inputs, targets)
        outputs = self.outputs if targets is None and self.send_fwd is None else {}
        self.inputs, self.outputs = {}, {}
        return self.loss_sum, outputs


def run_slots(chunks: list[StageRunner], slots: list[list[Action]], mailbox: Mailbox, inputs: torch.Tensor,
              targets: torch.Tensor | None) -> torch.Tensor:
    """Run one step's ``slots`` (``Action.chunk`` indexes ``chunks``); return this rank's weighted loss sum.

    Between two slots the previous slot's sends and the next slot's receives are posted as one batch
    (see p2p.py), so every input of a slot is here before its first action runs.
    """
    if chunks[0].boundary_check is not None:  # one check of the whole plan's boundaries
        chunks[0].boundary_check(inputs)
    for r in chunks:
        r.start_step(inputs.device, targets)
    mailbox.shapes.clear()  # shapes may change from step to step: the first micro-batch re-sends them
    flat = [a for slot in slots for a in slot]
    split = any(kind == "W" for kind, _, _ in flat)  # zb-h1: each backward runs as B, then W
    # ZeRO-3 units accumulate unsharded gradients and reduce-scatter once, in their chunk's last backward.
    last_backward = {c: max((i for i, (kind, _, cc) in enumerate(flat) if kind == "B" and cc == c), default=-1)
                     for c in range(len(chunks))}

    def post(sends: list[Send], slot: list[Action] | None) -> list[torch.Tensor | None]:
        recvs = [chunks[a[2]]._recv_for(a) for a in slot] if slot else []
        out = iter(mailbox.post(sends, [r for r in recvs if r is not None]))
        return [next(out) if r is not None else None for r in recvs]

    received = post([], slots[0])
    i = 0
    for si, slot in enumerate(slots):
        sends = []
        for (kind, k, c), got in zip(slot, received):
            runner = chunks[c]
            if kind == "F":
                send = runner.forward(k, inputs, targets, got)
            elif kind == "W":  # zb-h1: B (input gradient only) ran earlier; now the weight gradients
                send = backward_weight(runner, k)
            elif split:
                send = backward_input(runner, k, got)
            else:
                for m in runner.fsdp_modules:
                    m.set_requires_gradient_sync(i == last_backward[c])
                send = runner.backward(k, got)
            sends += [send] if send is not None else []
            i += 1
        received = post(sends, slots[si + 1] if si + 1 < len(slots) else None)
    return sum((r.loss_sum for r in chunks[1:]), chunks[0].loss_sum)
