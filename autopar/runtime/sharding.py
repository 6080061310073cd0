"""ZeRO for one unit: FSDP2 ``fully_shard`` for ZeRO-3; a flat sharded optimizer for ZeRO-1 and ZeRO-2.

ZeRO-3 is torch's own FSDP2 over the stage's DP mesh (2-D with the TP mesh when tp > 1). Gradients
are summed, not averaged (divide factor 1): the runtime already weights each micro-batch's loss by
its share of the global batch.

ZeRO-1/2 are written here rather than with ``ZeroRedundancyOptimizer`` because that class assigns
whole parameters to ranks of one group for the whole model, while a plan shards each unit over its
own DP group and the user's optimizer is a factory. Each unit's local tensors are viewed as one flat
vector; DP rank i of the group steps the i-th slice (its ``master`` tensor, which owns the optimizer
state) and an all-gather puts the updated slices back into every rank's parameters. This matches
the unsharded optimizer exactly for element-wise optimizers (SGD, Adam, AdamW, ...).

ZeRO-3 ``reshard: false`` is FSDP2's ``reshard_after_forward=False``: the parameters gathered for a
unit's forward stay gathered until its backward (FSDP2 reshards after every backward), for every
micro-batch of the schedule. ZeRO-1/2 ``zero_overlap`` (the distributed optimizer's overlap) issues
each unit's gradient reduce-scatter asynchronously from its backward (``AsyncReducer``: ZeRO-2 every
micro-batch, ZeRO-1 once its gradients of the call are complete, after its last micro-batch) and
its parameter all-gathers asynchronously after the optimizer step, all units at once; every handle is
waited for, in issue order, before the optimizer step reads the gradients and before ``step`` returns,
so the numbers are those of the synchronous path. The runtime does not defer the all-gather into the
next forward (Megatron's ``--overlap-param-gather``): parameters are current whenever ``step`` has
returned.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def apply_fsdp(unit: nn.Module, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy | None = None,
               reshard_after_forward: bool = True, ignored_params: set[nn.Parameter] | None = None) -> None:
    """ZeRO-3 ``unit`` over ``mesh`` (1-D DP mesh, or the "dp" dimension of a 2-D (dp, tp) mesh), with
    FSDP2's mixed-precision policy when one is given (precision_policy.fsdp_policy);
    ``reshard_after_forward`` is the plan's ``reshard`` (False: gathered from forward to backward);
    ``ignored_params`` stay as they are (expert shards no other rank of the stage holds)."""
    fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward,
                mp_policy=mp_policy or MixedPrecisionPolicy(), ignored_params=ignored_params)
    unit.set_gradient_divide_factor(1.0)
    unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM


def reshard_kept(units: Iterable[nn.Module]) -> None:
    """Free the gathered parameters of ZeRO-3 units after a forward-only run (``eval_step``, ``predict``):
    with ``reshard: false`` no backward follows to reshard them, and they would stay gathered until the
    next training step's backward. A unit already sharded is left alone (FSDP2's reshard is idempotent)."""
    for unit in units:
        if isinstance(unit, FSDPModule):
            unit.reshard()


class FlatShard:
    """ZeRO-1/2 state of one unit on one rank: its slice of the unit's flattened local tensors."""

    def __init__(self, tensors: list[torch.Tensor], group: dist.ProcessGroup, overlap: bool = False) -> None:
        self.tensors = tensors
        self.group = group
        self.overlap = overlap  # zero_overlap: all_gather_params issues, wait_params completes
        self._gather: tuple[dist.Work, torch.Tensor] | None = None
        self.world = dist.get_world_size(group)
        self.index = dist.get_rank(group)
        self.numel = sum(t.numel() for t in tensors)
        self.size = -(-self.numel // self.world)
        with torch.no_grad():
            flat = self._flatten(tensors)
            self.master = flat[self.index * self.size:(self.index + 1) * self.size].clone()

    def _flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)
        pad = self.size * self.world - flat.numel()
        return torch.nn.functional.pad(flat, (0, pad)) if pad else flat

    def set_grad_from_full(self, grads: list[torch.Tensor]) -> None:
        """ZeRO-1 (or ZeRO-2 after a full all-reduce): keep this rank's slice of the synced gradients."""
        flat = self._flatten(grads)
        self.master.grad = flat[self.index * self.size:(self.index + 1) * self.size].clone()

    def reduce_scatter_grad(self, grads: list[torch.Tensor]) -> None:
        """ZeRO-2: sum the group's gradients into this rank's slice (a reduce-scatter), adding to
        what earlier calls of this step left there."""
        flat = self._flatten(grads)
        out = torch.empty(self.size, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_single(out, flat, group=self.group)
        if self.master.grad is None:
            self.master.grad = out
        else:
            self.master.grad += out


    @torch.no_grad()
    def all_gather_params(self) -> None:
        """After the optimizer step: every rank of the group gets all updated slices (with ``overlap`` the
        all-gather is only issued here; ``wait_params`` completes it)."""
        full = torch.empty(self.size * self.world, dtype=self.master.dtype, device=self.master.device)
        # the master is not written again before wait_params (the same step), so it is sent as it is
        work = dist.all_gather_single(full, self.master, group=self.group, async_op=self.overlap)
        self.master.grad = None
        self._gather = (work, full)
        if not self.overlap:
            self.wait_params()

    @torch.no_grad()
    def wait_params(self) -> None:
        """Complete the all-gather ``all_gather_params`` issued (nothing when none is pending): the unit's
        tensors hold every updated slice afterwards."""
        if self._gather is None:
            return
        work, full = self._gather
        self._gather = None
        if work is not None:
            work.wait()
        offset = 0
        for t in self.tensors:
            t.copy_(full[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


class Zero2Reducer:
    """ZeRO-2 proper: a unit's gradients are reduce-scattered into this rank's slice as soon as its
    backward has produced them, in every micro-batch, and the full gradients are freed at once.

    Only a slice of the gradient outlives one unit's backward, as in DeepSpeed's ZeRO-2 with
    gradient accumulation (what the cost model's 2 + 14/d bytes per parameter assumes). The hooks
    fire in autograd order, which is the same on every DP rank of a stage (same graph), so the
    collectives line up. Reduce-scatter is linear: a parameter whose gradient lands after a flush is
    simply reduced by a later one; ``flush`` at the end of the schedule takes any remainder.
    """

    def __init__(self, shard: FlatShard, params: list[torch.Tensor]) -> None:
        self.shard, self.params = shard, params
        self.pending = 0
        for p in params:
            p.register_post_accumulate_grad_hook(self._landed)

    def _landed(self, _p: torch.Tensor) -> None:
        self.pending += 1
        if self.pending >= len(self.params):
            self._reduce()

    def _reduce(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self.shard.reduce_scatter_grad(grads)
        for p in self.params:
            p.grad = None
        self.pending = 0

    def flush(self) -> None:
        """Reduce whatever gradients are still held (a parameter unused in the last backward)."""
        if self.pending or any(p.grad is not None for p in self.params):
            self._reduce()


class AsyncReducer:
    """ZeRO-1/2 ``zero_overlap``: a unit's gradients are reduce-scattered into this rank's slice by
    collectives issued from its backward (``async_op``) and completed, in issue order, by ``flush``.

    ``passes``: the backward passes one reduce-scatter covers. ZeRO-2 issues one per micro-batch
    (``passes`` 1, as ``Zero2Reducer``); ZeRO-1 one per ``step`` call, once the call's ``passes`` =
    micro-batches have all landed (its gradients are complete only then: Megatron's
    ``overlap_grad_reduce``). Reduce-scatter is linear, so a collective issued early (a parameter
    that got no gradient in some pass) or by ``flush`` for a remainder sums the same gradients; the
    full gradients are handed to the collective and dropped from the parameters at once. As with
    ``Zero2Reducer``, the hooks fire in the same autograd order on every DP rank of a stage.
    """

    def __init__(self, shard: FlatShard, params: list[torch.Tensor], passes: int) -> None:
        self.shard, self.params, self.expected = shard, params, len(params) * max(1, passes)
        self.landed = 0
        self.pending: list[tuple[dist.Work, torch.Tensor, torch.Tensor]] = []  # (work, output, input)
        for p in params:
            p.register_post_accumulate_grad_hook(self._landed)

    def _landed(self, _p: torch.Tensor) -> None:
        self.landed += 1
        if self.landed >= self.expected:
            self._issue()

    def _issue(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = self.shard._flatten(grads)
        out = torch.empty(self.shard.size, dtype=flat.dtype, device=flat.device)
        work = dist.reduce_scatter_single(out, flat, group=self.shard.group, async_op=True)
        self.pending.append((work, out, flat))
        for p in self.params:
            p.grad = None
        self.landed = 0

    def flush(self) -> None:
        """Issue a reduce-scatter for gradients not yet handed to one, then wait for every pending one and
        add its output to this rank's slice, in issue order (the order ``Zero2Reducer`` adds them)."""
        if self.landed or any(p.grad is not None for p in self.params):
            self._issue()
        for work, out, _ in self.pending:
            work.wait()
            if self.shard.master.grad is None:
                self.shard.master.grad = out
            else:
                self.shard.master.grad += out
        self.pending = []


def backward_reducer(shard: FlatShard, params: list[torch.Tensor], zero: int, overlap: bool, direct: bool,
                     microbatches: int) -> Zero2Reducer | AsyncReducer | None:
    """What reduces a ZeRO-1/2 unit's gradients during backward, or None (the step-end sync does).

    ``direct``: the unit's sync group is exactly its DP (shard) group (tp 1, one placement), the only
    case a reduce-scatter into the shard is the whole sync. ZeRO-2: ``Zero2Reducer`` (``AsyncReducer``
    per micro-batch with ``overlap``); ZeRO-1 with ``overlap``: ``AsyncReducer`` once per call. Without
    ``direct`` the step-end all-reduce runs, overlap or not (the same numbers; nothing hidden).
    """
    if not direct:
        return None
    if overlap:
        return AsyncReducer(shard, params, 1 if zero == 2 else microbatches)
    return Zero2Reducer(shard, params) if zero == 2 else None
