"""BatchNorm over a unit's data-parallel group: SyncBatchNorm's semantics, on any backend (gloo included).

A data-parallel unit sees its rows of the micro-batch only. When one micro-batch is the whole
global batch (one pipeline, one micro-batch: ``checks.check_batchnorm`` refuses anything else), the
unit's DP group together holds every row, so statistics taken over the group are the single-process
ones: the per-channel mean is the all-reduced sum over the all-reduced count, the variance the
all-reduced sum of squared deviations from that mean (two passes, as a single-device batch norm
computes it), and the running statistics are updated from them exactly as ``nn.BatchNorm*`` does
(unbiased variance, ``momentum`` or the cumulative average when it is None). The sums are
all-reduced by ``_AllReduceSum``, whose backward all-reduces the gradient (the derivative of a sum
over ranks), so the input gradient is the single-process one. Every DP rank runs the same forward and backward, so the
collectives line up. ``torch.nn.SyncBatchNorm`` is not used: its kernels are CUDA-only.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class _AllReduceSum(torch.autograd.Function):
    """Sum over ``group``; backward: the gradient summed over ``group`` (every rank's loss depends on the sum)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = grad.clone()
        dist.all_reduce(out, group=ctx.group)
        return out, None


def all_reduce(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Differentiable sum of ``x`` over ``group``."""
    return _AllReduceSum.apply(x, group)


def has_batchnorm(unit: nn.Module) -> bool:
    """True when ``unit`` holds a BatchNorm module."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in unit.modules())


def apply_sync_batchnorm(unit: nn.Module, group: dist.ProcessGroup) -> int:
    """Make every BatchNorm module of ``unit`` take batch statistics over ``group``; returns how many."""
    count = 0
    for m in unit.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.forward = partial(_forward, m, group)
            count += 1
    return count


def _forward(m: nn.modules.batchnorm._BatchNorm, group: dist.ProcessGroup, x: torch.Tensor) -> torch.Tensor:
    """``nn.BatchNorm*.forward`` with the batch statistics of the rows of every rank of ``group``."""
    m._check_input_dim(x)
    factor = 0.0 if m.momentum is None else m.momentum
    if m.training and m.track_running_stats and m.num_batches_tracked is not None:
        m.num_batches_tracked.add_(1)
        factor = 1.0 / float(m.num_batches_tracked) if m.momentum is None else m.momentum
    batch_stats = m.training or (m.running_mean is None and m.running_var is None)
    if not batch_stats:  # eval with running statistics: row by row, nothing to share
        return F.batch_norm(x, m.running_mean, m.running_var, m.weight, m.bias, False, 0.0, m.eps)
    dims = [0] + list(range(2, x.dim()))
    shape = [1, -1] + [1] * (x.dim() - 2)
    count = torch.tensor([x.numel() // x.shape[1]], dtype=x.dtype, device=x.device)
    dist.all_reduce(count, group=group)
    mean = all_reduce(x.sum(dims), group) / count
    centred = x - mean.view(shape)
    var = all_reduce((centred * centred).sum(dims), group) / count
    out = centred * torch.rsqrt(var + m.eps).view(shape)
    if m.weight is not None:
        out = out * m.weight.view(shape)
    if m.bias is not None:
        out = out + m.bias.view(shape)
    if m.training and m.running_mean is not None:
        with torch.no_grad():
            unbiased = var.detach() * (count / (count - 1).clamp(min=1))
            m.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
            m.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
    return out
