"""What the tracer sees of each unit's ops for op-level selective checkpointing (ckpt ``op``).

While the traced forward runs, ``OpTrace`` records per unit, in execution order, each matmul
(``aten.mm``, ``aten.addmm``, ``aten.linear``: its output bytes, FLOPs and the innermost module that ran
it) and each ``F.scaled_dot_product_attention`` call (its output plus fp32 log-sum-exp statistics, and
its FLOPs). On the meta device SDPA runs its math fallback (``bmm``, softmax); on a real device it runs a
fused kernel (flash, efficient, cuDNN, CPU flash) whose outputs the op policy saves, so the call itself
is what counts. ``op_facts`` turns a unit's records into ``op_policy.OpSaved``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autopar.modelspec.op_policy import Matmul, OpSaved, op_saved
from autopar.modelspec.spec import STATS_BYTES
from cost_models.gemm_shapes import Gemm

aten = torch.ops.aten
MATMULS = {aten.mm.default: 0, aten.linear.default: 0, aten.addmm.default: 1}  # op -> which arg is [.., k]
# batched products that compute attention scores Q K^T (per head) -> which arg is [.., k] (the head dim
# contracted); not mm: a linear layer whose output width equals the sequence is a mm to seq x seq
SCORE_MATMULS = {aten.bmm.default: 0, aten.baddbmm.default: 1}
# F.dropout off CUDA (meta, CPU) scales the input by a mask of the input's dtype drawn with bernoulli_, where CUDA's
# fused native_dropout keeps a bool mask: 1 byte an element
DROPOUT_DRAWS = {aten.bernoulli_.float, aten.bernoulli_.Tensor}


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def storage_id(t: torch.Tensor) -> int:
    """Storage identity (works on meta, where every data pointer is 0)."""
    return t.untyped_storage()._cdata


class OpTrace(TorchDispatchMode):
    """Records matmuls per unit; ``where()`` gives (unit running now or None, innermost module or None).

    ``scores``: storages of attention scores, found by where they come from rather than by shape (a hidden
    state is seq x seq too when the hidden size equals the sequence): a product ending in seq x seq over a
    contracted dim other than seq (Q K^T over the head dim), and every seq x seq result of an op that reads
    one (scaling, masking, softmax, dropout, casts)."""

    def __init__(self, where: Callable[[], tuple[str | None, nn.Module | None]], seq_len: int = 0) -> None:
        super().__init__()
        self.where, self.seq = where, seq_len
        self.in_sdpa = 0
        self.scores: set[int] = set()
        self.masks: set[int] = set()  # dropout masks (DROPOUT_DRAWS)
        self.keep: list[torch.Tensor] = []  # meta tensors whose storage identity the trace reads: kept alive so
        # no later storage reuses it (the recorder's saved tensors and norm outputs too)
        self.events: dict[str, list[tuple[str, float, float, nn.Module | None, tuple[int, int, int] | None]]] = {}

    def record(self, kind: str, nbytes: float, flops: float, shape: tuple[int, int, int] | None = None) -> None:
        """One op of the running unit: ``shape`` (rows, k, n) for a matmul ``[rows, k] @ [k, n]``."""
        unit, mod = self.where()
        if unit is not None:
            self.events.setdefault(unit, []).append((kind, nbytes, flops, mod, shape))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in MATMULS and not self.in_sdpa:
            k, n = args[MATMULS[func]].shape[-1], out.shape[-1]
            self.record("mm", _bytes(out), 2.0 * out.numel() * k, (out.numel() // max(n, 1), k, n))
        if self.seq > 1 and not self.in_sdpa:  # a fused SDPA kernel keeps no scores (SdpaTrace)
            self._mark_scores(func, args, out)
        if func in DROPOUT_DRAWS:
            self.masks.add(storage_id(out))
            self.keep.append(out)
        return out

    def _mark_scores(self, func, args: tuple, out) -> None:
        square = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.dim() >= 2
                  and t.shape[-1] == t.shape[-2] == self.seq]
        if not square:
            return
        from_qk = func in SCORE_MATMULS and args[SCORE_MATMULS[func]].shape[-1] != self.seq
        if from_qk or any(isinstance(a, torch.Tensor) and storage_id(a) in self.scores for a in tree_flatten(args)[0]):
            self.scores.update(storage_id(t) for t in square)
            self.keep += square


class SdpaTrace(TorchFunctionMode):
    """Records each ``F.scaled_dot_product_attention`` call into ``ops`` (its inner ops are not matmuls) and
    hands ``saves`` what the fused kernel keeps for backward: (query, key, value, output, mask or None) and
    the bytes of its fp32 statistics. While a call runs ``ops.in_sdpa`` is non-zero: the meta device's math
    fallback is running, whose tensors (the s x s scores) a fused kernel never keeps."""

    def __init__(self, ops: OpTrace, saves: Callable[[tuple, float], None]) -> None:
        super().__init__()
        self.ops, self.saves = ops, saves

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.ops.in_sdpa += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.ops.in_sdpa -= 1
        if out.dim() == 4:  # fused kernels write (batch, seq, heads, dim) and return it transposed: a later
            out = out.transpose(1, 2).contiguous().transpose(1, 2)  # transpose + reshape is then a view
        q, k, v = (args[i] if len(args) > i else kwargs[n] for i, n in enumerate(("query", "key", "value")))
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        rows = q.numel() // q.shape[-1]
        self.ops.record("sdpa", _bytes(out) + rows * STATS_BYTES, 2.0 * rows * k.shape[-2] * (q.shape[-1] + out.shape[-1]))
        self.saves((q, k, v, out, mask), rows * STATS_BYTES)
        return out


def op_facts(events: list, input_bytes: float, flops: float, rows: set[nn.Module], batch: int) -> OpSaved:
    """``OpSaved`` per sample of a unit from its records: input kept, odd matmuls and SDPA saved.

    ``rows``: the unit's row-parallel modules (its TP plan); every FLOP that is neither a matmul nor
    SDPA (eager attention's ``bmm``, convolutions) is recomputed.
    """
    mms = [Matmul(b / batch, f / batch, mod in rows) for kind, b, f, mod, _ in events if kind == "mm"]
    sdpa = [(b / batch, f / batch) for kind, b, f, _, _ in events if kind == "sdpa"]
    rest = flops - sum(m.flops for m in mms) - sum(f for _, f in sdpa)
    return op_saved(input_bytes, mms, sum(b for b, _ in sdpa), max(0.0, rest))


def gemm_facts(events: list, rows: set[nn.Module], batch: int, seq_len: int) -> tuple[tuple[Gemm, ...], int]:
    """(``LayerSpec.gemms``, ``gemm_rows``) of a unit from its records: its matmuls over every token of
    the sample (``seq_len`` rows per sample), in execution order; ``rows``: its TP plan's row-parallel
    modules. Matmuls over other row counts (a classifier on one token, routed experts) are not listed,
    so they run at the large-GEMM efficiency. ((), 0) when none is left."""
    gemms = tuple(Gemm(k, n, mod in rows) for kind, _, _, mod, shape in events
                  if kind == "mm" and shape is not None and (k := shape[1]) > 0 and (n := shape[2]) > 0
                  and shape[0] == seq_len * batch)
    return gemms, (seq_len if gemms else 0)
