"""``ParallelModel``: this rank's share of a model trained as a plan says (built by ``wrap``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.plan.schema import Plan
from autopar.runtime.grad_sync import UnitGradSync
from autopar.runtime.guards import check_same_batch, finite_step
from autopar.runtime.layout import Placement
from autopar.runtime.p2p import Mailbox
from autopar.runtime.sharding import FlatShard, Zero2Reducer
from autopar.runtime.stage import LocalUnit, StageRunner

log = logging.getLogger(__name__)


@dataclass
class _UnitState:
    unit: LocalUnit
    place: Placement
    sync: UnitGradSync
    proxies: list[torch.Tensor]  # what the optimizer steps for this unit
    shard: FlatShard | None  # ZeRO-1/2
    zero2: Zero2Reducer | None  # ZeRO-2 whose sync group is its shard group: reduce-scatters in backward


class ParallelModel:
    """This rank's share of a model trained as a plan says. Build it with ``wrap``.

    ``step(inputs, targets)`` runs one optimizer step over the whole global batch; every rank passes
    the same full global-batch tensors (batch dimension first) and gets the global mean loss back.
    ``full_state_dict()`` returns every unsharded parameter on every rank (a collective).
    ``optimizer`` is the optimizer the factory built over this rank's tensors. ``skipped_steps``
    lists the steps (numbered from 1 by ``step`` call) skipped under ``on_nonfinite="skip"``.
    """

    def __init__(self, plan: Plan, device: torch.device, runner: StageRunner, states: list[_UnitState],
                 optimizer: torch.optim.Optimizer, mailbox: Mailbox, shapes: dict, places: dict,
                 on_nonfinite: str) -> None:
        self.plan, self.device, self.runner, self.optimizer = plan, device, runner, optimizer
        self._states, self._mailbox, self._shapes, self._places = states, mailbox, shapes, places
        self.rank = dist.get_rank()
        self.pipeline, self.stage = runner.spec.pipeline, runner.spec.stage
        self.on_nonfinite, self.skipped_steps, self._calls = on_nonfinite, [], 0

    @property
    def local_units(self) -> dict[str, nn.Module]:
        """The units this rank runs (TP / FSDP-wrapped modules), by name."""
        return {s.unit.name: s.unit.module for s in self._states}

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """One optimizer step over the global batch; returns the global mean loss (same on every rank).

        Raises AutoparError, the same on every rank, if the ranks passed different batches, or (with
        ``on_nonfinite="raise"``) if the loss or a gradient is NaN/inf; ``"skip"`` leaves the
        parameters and optimizer state untouched for that step instead and returns the loss.
        """
        self._calls += 1
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        check_same_batch(inputs, targets, self._calls)
        gbs = self.plan.global_batch_size
        if inputs.shape[0] != gbs or targets.shape[0] != gbs:
            raise AutoparError("step inputs", f"batch dimensions {inputs.shape[0]} / {targets.shape[0]} differ "
                               f"from the plan's global_batch_size {gbs}", "pass the whole global batch on every rank")
        loss_sum = self.runner.run(inputs, targets)
        self._mailbox.flush()
        for st in self._states:
            if st.zero2 is not None:  # already reduce-scattered during backward
                st.zero2.flush()
                continue
            synced = st.sync.sync()
            if st.shard is not None:
                st.shard.set_grad_from_full(synced)
            else:
                for proxy, g in zip(st.proxies, synced):
                    proxy.grad = g
            self._free_accumulated_grads(st)
        grads = [g for st in self._states for g in ([st.shard.master.grad] if st.shard is not None
                                                     else [p.grad for p in st.proxies]) if g is not None]
        loss, problem = finite_step(loss_sum, grads, self._calls)
        if problem is None:
            self.optimizer.step()
        for st in self._states:
            if st.shard is not None and problem is None:
                st.shard.all_gather_params()
            for p in st.unit.module.parameters():
                p.grad = None
        self.optimizer.zero_grad(set_to_none=True)
        if problem is not None:
            if self.on_nonfinite == "raise":
                raise AutoparError("step", problem, "check this step's batch and the learning rate, or pass "
                                   "wrap(..., on_nonfinite='skip') to skip such steps")
            self.skipped_steps.append(self._calls)
            if self.rank == 0:
                log.warning("autopar: %s: optimizer step skipped (on_nonfinite='skip')", problem)
        return loss

    @staticmethod
    def _free_accumulated_grads(st: _UnitState) -> None:
        """Drop the unit's accumulated gradients once the optimizer's copies are set.

        The optimizer reads the synced gradients from the proxies (or the ZeRO-1/2 shard); the
        module's own ``.grad`` (a DTensor wrapper under TP, the full gradient under ZeRO-1/2) would
        otherwise stay alive beside them through the optimizer step. A plain parameter that is its
        own proxy keeps its gradient (the proxies share storage with what they were given).
        """
        proxies = {id(t) for t in st.proxies}
        for p in st.unit.module.parameters():
            if id(p) not in proxies:
                p.grad = None

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter of the model, unsharded, on the CPU of every rank (call on all ranks).

        Each unit is taken from its first placement (pipeline 0) and broadcast from that stage's
        first device.
        """
        local = {s.unit.name: s for s in self._states}
        out: dict[str, torch.Tensor] = {}
        # Gathering FSDP x TP parameters takes two all-gathers and torch logs a warning per parameter
        # about it; this runs once per export, so keep the log readable.
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        for name, shapes in self._shapes.items():
            if not shapes:
                continue
            owner = self._places[name][0]
            flat = None
            if name in local and self.runner.spec.pipeline == owner.pipeline:
                fulls = [p.full_tensor() if isinstance(p, DTensor) else p.detach()
                         for p in local[name].unit.module.parameters()]
                flat = torch.cat([f.reshape(-1) for f in fulls]).to(self.device)
            numel = sum(torch.Size(s).numel() for _, s, _ in shapes)
            if self.rank != owner.devices[0]:
                flat = torch.empty(numel, dtype=shapes[0][2], device=self.device)
            dist.broadcast(flat, src=owner.devices[0])
            offset = 0
            for fqn, shape, _ in shapes:
                n = torch.Size(shape).numel()
                out[f"{name}.{fqn}"] = flat[offset:offset + n].view(shape).cpu().clone()
                offset += n
        return out
