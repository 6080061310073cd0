"""Per-step checks of ``ParallelModel.step``, each decided collectively so every rank raises the same.

- ``check_same_batch``: every rank must pass the same global batch. A cheap fingerprint (shape and
  dtype, the sum and a position-weighted sum of the tensors' bytes read as integers, computed on the
  device in exact wrapping integer arithmetic) is all-gathered before any compute: different data
  orders, shards or shapes are refused instead of training silently on a mixture (or hanging in a
  pipeline receive of the wrong shape).
- ``finite_step``: the global loss and every rank's synced gradients must be finite. One all-reduce
  carries the loss and a non-finite flag per rank, so the verdict and the ranks named are the same
  everywhere.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.distributed as dist

from autopar.errors import AutoparError
from autopar.runtime.agreement import rank_list

_GOLDEN = 0x9E3779B1  # Knuth's multiplicative hash constant: spreads positions over 32 bits


def _fingerprint(t: torch.Tensor) -> list[torch.Tensor]:
    meta = int(hashlib.sha256(f"{tuple(t.shape)} {t.dtype}".encode()).hexdigest()[:15], 16)
    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else torch.zeros(0, dtype=torch.uint8, device=t.device)
    aligned = raw.numel() % 4 == 0 and raw.storage_offset() % 4 == 0
    words = (raw.view(torch.int32) if aligned else raw).to(torch.int64)
    weights = (torch.arange(words.numel(), dtype=torch.int64, device=t.device) * _GOLDEN) & 0xFFFFFFFF
    return [torch.tensor(meta, dtype=torch.int64, device=t.device), words.sum(), (words * (weights | 1)).sum()]


def check_same_batch(inputs: torch.Tensor, targets: torch.Tensor, step: int) -> None:
    """Collective: raise AutoparError on every rank unless all ranks passed the same (inputs, targets)."""
    mine = torch.stack(_fingerprint(inputs) + _fingerprint(targets))
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    prints = [tuple(r.tolist()) for r in rows]
    if len(set(prints)) == 1:
        return
    which = "inputs" if len({p[:3] for p in prints}) > 1 else "targets"
    key = (lambda p: p[:3]) if which == "inputs" else (lambda p: p[3:])
    sides: dict = {}
    for r, p in enumerate(prints):
        sides.setdefault(key(p), []).append(r)
    groups = " vs ".join(rank_list(rs) for rs in sides.values())
    raise AutoparError("step inputs", f"ranks passed different {which} at step {step} ({groups})",
                       "pass every rank the same global batch (same data, order and seed); "
                       "autopar splits it between the ranks itself")


def finite_step(loss_sum: torch.Tensor, grads: list[torch.Tensor], step: int) -> tuple[float, str | None]:
    """Collective: (global loss, None) when the loss and every rank's gradients are finite, else
    (global loss, the problem in words, the same on every rank)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    flags = torch.zeros(1 + world, dtype=torch.float64, device=loss_sum.device)
    flags[0] = loss_sum.detach().reshape(()).to(torch.float64)
    grads = [g for g in grads if g.numel()]  # an uneven ZeRO/FSDP shard can be empty here
    if grads:
        norm = torch.nn.utils.get_total_norm(grads, norm_type=math.inf)  # NaN and inf propagate; no overflow
        flags[1 + rank] = (~torch.isfinite(norm)).to(torch.float64)
    dist.all_reduce(flags)
    values = flags.tolist()
    loss, bad = values[0], [r for r, f in enumerate(values[1:]) if f != 0]
    if math.isfinite(loss) and not bad:
        return loss, None
    if not math.isfinite(loss):
        return loss, f"non-finite loss ({loss}) at step {step}"
    return loss, f"non-finite gradients at step {step} on {rank_list(bad)} (loss {loss:.6g})"
