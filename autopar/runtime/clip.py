"""The global gradient norm of a parallel model, each logical gradient element counted exactly once.

After the step's gradient sync every rank holds synced gradients of its units, in one of three
forms: whole local tensors (DDP copies, TP shards, FSDP shards: the optimizer's proxies) or a slice
of the unit's flattened local tensors (ZeRO-1/2 ``FlatShard.master``). Copies of the same region
live on several ranks (other pipelines, other DP chunks, other TP ranks of a replicated parameter),
so each rank adds the squares of only the regions it *owns*:

- a unit counts only on its first placement (pipeline order; every placement holds the same synced
  gradients);
- inside that placement a DDP copy counts only on DP chunk 0, while ZeRO-1/2 slices and FSDP shards
  count on every DP rank (they are disjoint);
- a parameter TP shards counts on every TP rank; one TP leaves whole (a norm, a bias of a
  row-parallel linear, a sequence-parallel norm after its sync) counts on TP coordinate 0 only.

One all-reduce of the sum over the world gives every rank the same norm, equal (to float rounding)
to ``torch.nn.utils.clip_grad_norm_`` of the single-process model.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from autopar.runtime.layout import Placement


def _tp_sharded(st, p: torch.Tensor) -> bool:
    placement = st.sync._tp_placement(p)
    return placement is not None and placement.is_shard()


def _owned_square_sum(st, owner: Placement, rank: int, skip: frozenset = frozenset()) -> torch.Tensor | None:
    """Sum of squares of the gradient elements of one unit state this rank owns (None: none).

    ``skip``: (unit, parameter index) of tied copies counted elsewhere (a tie counts once).
    """
    if st.place.pipeline != owner.pipeline or not st.sync.params:
        return None
    if hasattr(st.sync, "owned_square_sum"):  # an expert-parallel unit (autopar.runtime.expert_parallel)
        return st.sync.owned_square_sum(st, rank, skip)
    lay = st.place.layout
    tp_coord = lay.tp_coord(rank) if lay.tp > 1 else 0
    if st.shard is None and not st.place.fsdp and lay.chunk_of(rank) != 0:
        return None  # a DDP copy: DP chunk 0 counts it
    if st.shard is not None:
        g = st.shard.master.grad
        if g is None:
            return None
        name = st.unit.name
        if tp_coord != 0 or any(u == name for u, _ in skip):  # mask out what another rank / copy counts
            mask = torch.ones(st.shard.size * st.shard.world, dtype=torch.bool, device=g.device)
            offset = 0
            for i, (p, t) in enumerate(zip(st.sync.params, st.shard.tensors)):
                if (tp_coord != 0 and not _tp_sharded(st, p)) or (name, i) in skip:
                    mask[offset:offset + t.numel()] = False
                offset += t.numel()
            lo = st.shard.index * st.shard.size
            g = g[mask[lo:lo + st.shard.size]]
        return g.float().pow(2).sum()
    total = None
    for i, (p, proxy) in enumerate(zip(st.sync.params, st.proxies)):
        if proxy.grad is None or (tp_coord != 0 and not _tp_sharded(st, p)) or (st.unit.name, i) in skip:
            continue
        s = proxy.grad.float().pow(2).sum()
        total = s if total is None else total + s
    return total


def optimizer_grads(states) -> list[torch.Tensor]:
    """The gradients the optimizer will read on this rank (each tensor once)."""
    seen, out = set(), []
    for st in states:
        for t in ([st.shard.master] if st.shard is not None else st.proxies):
            if t.grad is not None and id(t.grad) not in seen:
                seen.add(id(t.grad))
                out.append(t.grad)
    return out


@torch.no_grad()
def global_grad_norm(states, places: dict[str, list[Placement]], rank: int, device: torch.device,
                     tied=None) -> float:
    """Collective over the world: the L2 norm of the whole model's synced gradient (same on every rank).

    ``tied`` (autopar.runtime.ties.TiedGrads, after its ``sync``): a tensor shared by two units counts once.
    """
    skip = tied.duplicates if tied is not None else frozenset()
    total = torch.zeros((), dtype=torch.float64, device=device)
    for st in states:
        s = _owned_square_sum(st, places[st.unit.name][0], rank, skip)
        if s is not None:
            total += s.to(torch.float64)
    dist.all_reduce(total)
    return math.sqrt(total.item()) if total.item() >= 0 else float("nan")


@torch.no_grad()
def scale_grads(states, factor: float) -> None:
    """Multiply every gradient the optimizer reads by ``factor`` (in place)."""
    for g in optimizer_grads(states):
        g.mul_(factor)


def clip_coefficient(norm: float, max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_``'s factor: max_norm / (norm + 1e-6), at most 1 (NaN stays NaN)."""
    if math.isnan(norm):
        return norm
    return min(1.0, max_norm / (norm + 1e-6))
