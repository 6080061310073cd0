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
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def apply_fsdp(unit: nn.Module, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy | None = None,
               ignored_params: set[nn.Parameter] | None = None) -> None:
    """ZeRO-3 ``unit`` over ``mesh`` (1-D DP mesh, or the "dp" dimension of a 2-D (dp, tp) mesh), with
    FSDP2's mixed-precision policy when one is given (precision_policy.fsdp_policy); ``ignored_params``
    stay as they are (expert shards no other rank of the stage holds)."""
    fully_shard(unit, mesh=mesh, reshard_after_forward=True, mp_policy=mp_policy or MixedPrecisionPolicy(),
                ignored_params=ignored_params)
    unit.set_gradient_divide_factor(1.0)
    unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM


class FlatShard:
    """ZeRO-1/2 state of one unit on one rank: its slice of the unit's flattened local tensors."""

    def __init__(self, tensors: list[torch.Tensor], group: dist.ProcessGroup) -> None:
        self.tensors = tensors
        self.group = group
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
        """After the optimizer step: every rank of the group gets all updated slices."""
        full = torch.empty(self.size * self.world, dtype=self.master.dtype, device=self.master.device)
        dist.all_gather_single(full, self.master, group=self.group)
        offset = 0
        for t in self.tensors:
            t.copy_(full[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        self.master.grad = None


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
