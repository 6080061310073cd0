"""Count the HBM bytes an eager module's memory-bound kernels move, from the aten ops it really dispatches.

``CostParams.act_traffic`` prices a layer's memory-bound kernels (norms, activations, rotary embeddings,
residual adds, dtype casts, and their gradients) as a multiple of the activation bytes the layer saves. 3 is
the floor of fused kernels (each saved byte written once and read once, its gradient the same). An eager
PyTorch module launches one kernel per operator and each reads its inputs from HBM and writes its output
back: an RMSNorm that upcasts to fp32 moves its tensor a dozen times. How much more depends on the model's
code, so it is counted, not assumed: ``count_traffic`` runs a forward and a backward under a
``TorchDispatchMode`` (meta tensors work: nothing is computed) and sums, for every aten op that is not a
matmul, an attention kernel or a view, the bytes of its tensor inputs and outputs. Matmuls and attention are
priced by FLOPs (``cost_models.compute``), views move nothing.

It is an upper bound of an eager kernel's traffic (an op's input may still be in L2) and the exact count of
what the kernels are asked to move; ``benchmarks/eager_traffic.py`` turns it into ``act_traffic`` for the
measured files whose frameworks run eager.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Priced by FLOPs, not by memory traffic: dense matmuls and the fused attention kernels.
COMPUTE_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "convolution",
               "convolution_backward")
# Ops that only reinterpret a tensor's metadata, or allocate storage without writing it (no kernel, no traffic).
# Fills (zeros, ones, fill_) write their output and are counted.
VIEW_OPS = ("view", "_unsafe_view", "reshape", "expand", "transpose", "t", "permute", "as_strided", "slice",
            "select", "unsqueeze", "squeeze", "view_as_complex", "view_as_real", "_reshape_alias", "detach",
            "alias", "split", "split_with_sizes", "unbind", "chunk", "narrow", "lift_fresh", "_local_scalar_dense",
            "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size")
ALLOC_OPS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


def _bytes(tensors: list) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def counted(name: str) -> bool:
    """Whether an aten op's traffic is memory-bound work the count includes (``name``: the overload packet's
    name, e.g. ``mul`` or ``_fused_rms_norm``)."""
    base = name.rstrip("_")
    return not (base in COMPUTE_OPS or base in VIEW_OPS or base in ALLOC_OPS or "attention" in base)


@dataclass
class TrafficCount:
    """Bytes the counted ops moved, per phase, with the ops behind them."""

    fwd_bytes: int = 0
    bwd_bytes: int = 0
    by_op: Counter = field(default_factory=Counter)
    fwd_kernels: int = 0  # ops that launch a kernel (counted and compute ops; views and allocations do not)
    bwd_kernels: int = 0


class _Meter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.kernels = 0
        self.by_op: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        base = name.rstrip("_")
        self.kernels += base not in VIEW_OPS and base not in ALLOC_OPS
        if counted(name):
            moved = _bytes(tree_flatten((args, kwargs))[0]) + _bytes(tree_flatten(out)[0])
            self.total += moved
            self.by_op[name] += moved
        return out


def count_traffic(forward: Callable[[], torch.Tensor], grad: torch.Tensor | None = None) -> TrafficCount:
    """The bytes ``forward()``'s memory-bound ops move, and those of its backward (seeded with ``grad``, ones
    of the output's shape when None). Parameters and inputs that require grad get their gradients written."""
    count = TrafficCount()
    with _Meter() as meter:
        out = forward()
    count.fwd_bytes, count.fwd_kernels, count.by_op = meter.total, meter.kernels, Counter(meter.by_op)
    seed = grad if grad is not None else torch.ones_like(out)
    with _Meter() as meter:
        out.backward(seed)
    count.bwd_bytes, count.bwd_kernels = meter.total, meter.kernels
    count.by_op.update({f"{k} (bwd)": v for k, v in meter.by_op.items()})
    return count


class _FusedAttention(torch.autograd.Function):
    """Stand-in for a fused (flash) attention kernel: its output and gradients have the real shapes, and no op
    inside it is counted (off the meta device, PyTorch's SDPA would decompose into a math path whose s x s
    softmax a flash kernel never writes). Attention is priced by FLOPs."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx.inputs = (q, k, v)  # their shapes only (grouped-query k and v keep their own head count)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return tuple(torch.empty_like(t) for t in ctx.inputs)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v)``'s shape under a flash kernel, with nothing counted inside."""
    return _FusedAttention.apply(q, k, v)
