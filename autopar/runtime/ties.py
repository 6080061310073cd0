"""Parameters shared by two units (tied embeddings, one module object used at two positions), kept tied.

Each unit is placed, sharded and synchronised on its own, so a tensor two units share cannot stay one
tensor across ranks. As Megatron does with tied embeddings, the later unit gets its own copy (equal
values: a clone of the same tensor) and, once per step after each unit's own gradient sync, the
copies' gradients are summed among every rank holding a copy (``TiedGrads``): every copy then holds
the gradient of the single shared tensor, the optimizer (element-wise) updates all copies alike, and
they stay identical, as the one tensor of the single-process model.

Every copy may be sharded its own way (TP, ZeRO-1/2/3, other stages): each holder rebuilds the
copy's full gradient, so the sum is the same everywhere. In a meta-device model each copy is
materialised with the value the tensor's first unit gives it (runtime.meta_build, as
``init_weights``). Refused before any collective (``check_ties``): TP together with ZeRO-1/2 on a
tied unit (its flat shard holds TP-local slices) and a BatchNorm module shared by two units (its
running statistics would update once per copy instead of twice on one tensor).
Other shared buffers are copied, right for constants (rotary tables, masks), not for a buffer a
forward pass mutates. A global gradient norm must count a tie once (skip the copies after ``Tie.copies[0]``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.plan.schema import Plan
from autopar.runtime.grad_sync import _local_region
from autopar.runtime.layout import Placement


@dataclass(frozen=True)
class Copy:
    unit: str
    index: int  # position in ``list(unit.parameters())`` (checkpoint wrappers keep the order)
    fqn: str


@dataclass(frozen=True)
class Tie:
    """One tensor of the single-process model and its copies, the original first."""

    copies: tuple[Copy, ...]

    @property
    def units(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.unit for c in self.copies))


def untie(named: list[tuple[str, nn.Module]]) -> tuple[list[tuple[str, nn.Module]], list[Tie]]:
    """Units with no tensor or module shared between two of them, and the ties that were cut.

    A unit sharing anything with an earlier unit is replaced by a deep copy in which only the shared
    modules and tensors are new (clones, equal values); its own tensors stay the caller's.
    """
    seen_params: dict[int, Copy] = {}
    seen_modules: dict[int, str] = {}
    seen_buffers: dict[int, str] = {}
    ties: dict[int, list[Copy]] = {}
    out = []
    for name, unit in named:
        params = dict(unit.named_parameters())
        shared = [fqn for fqn, p in params.items() if id(p) in seen_params]
        shared_mods = [(fqn, m) for fqn, m in unit.named_modules() if id(m) in seen_modules]
        shared_bufs = [fqn for fqn, b in unit.named_buffers() if id(b) in seen_buffers]
        for fqn, m in shared_mods:
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                raise AutoparError("model", f"{seen_modules[id(m)]} and {name}{'.' + fqn if fqn else ''} are the "
                                   f"same {type(m).__name__} (used twice: its running statistics update twice "
                                   "per forward, which copies cannot reproduce)",
                                   "use a separate norm module at each position")
        if shared or shared_mods or shared_bufs:
            originals = list(unit.parameters())
            keep = {id(t): t for t in list(originals) + list(unit.buffers())
                    if id(t) not in seen_params and id(t) not in seen_buffers}
            clone = copy.deepcopy(unit, memo=dict(keep))
            for i, (fqn, p) in enumerate(params.items()):
                if id(p) in seen_params:
                    ties.setdefault(id(p), [seen_params[id(p)]]).append(Copy(name, i, fqn))
            unit_out = clone
        else:
            unit_out = unit
        for i, (fqn, p) in enumerate(params.items()):
            seen_params.setdefault(id(p), Copy(name, i, fqn))
        for fqn, m in unit.named_modules():
            seen_modules.setdefault(id(m), f"{name}{'.' + fqn if fqn else ''}")
        for fqn, b in unit.named_buffers():
            seen_buffers.setdefault(id(b), f"{name}.{fqn}")
        out.append((name, unit_out))
    return out, [Tie(tuple(cs)) for cs in ties.values()]


def check_ties(ties: list[Tie], plan: Plan) -> None:
    """Refuse ties the runtime cannot keep exact (one line naming the tied tensors and the fix)."""
    for tie in ties:
        a, b = tie.copies[0], tie.copies[1]
        what = f"{a.unit}.{a.fqn} and {b.unit}.{b.fqn} are the same tensor (tied weights)"
        for pi, pipe in enumerate(plan.pipelines):
            for si, st in enumerate(pipe.stages):
                for li, ly in enumerate(st.layers):
                    dp = len(st.devices) // ly.strategy.tp
                    zero = ly.strategy.zero if dp > 1 else 0
                    if ly.name in tie.units and ly.strategy.tp > 1 and zero in (1, 2):
                        raise AutoparError(
                            f"pipelines[{pi}].stages[{si}].layers[{li}].zero",
                            f"{what}: the runtime syncs tied copies under tp or under ZeRO-1/2, not both, but "
                            f"unit {ly.name} has tp {ly.strategy.tp} and zero {ly.strategy.zero}",
                            f"give units {', '.join(tie.units)} zero 0 or 3, or tp 1")


def tie_rank_sets(ties: list[Tie], places: dict[str, list[Placement]]) -> list[tuple[int, ...]]:
    """The process groups the ties need: every rank holding a copy of a tied tensor."""
    return [_holders(tie, places) for tie in ties]


def _holders(tie: Tie, places: dict[str, list[Placement]]) -> tuple[int, ...]:
    return tuple(sorted({d for u in tie.units for p in places[u] for d in p.devices}))


class TiedGrads:
    """Per step: set every local copy's gradient to the sum of the copies' (synced) gradients.

    Each copy's full gradient is rebuilt on its holders (an all-gather over its ZeRO / FSDP / TP
    shards; nothing for a plain tensor), one holder per copy contributes it to an all-reduce over
    every holder of any copy, and each rank keeps its own region of the sum.
    """

    def __init__(self, ties: list[Tie], places: dict[str, list[Placement]], rank: int, groups) -> None:
        self.jobs = []
        # (unit, parameter index) of every copy after the first: a global gradient norm skips them.
        self.duplicates = frozenset((c.unit, c.index) for tie in ties for c in tie.copies[1:])
        for tie in ties:
            holders = _holders(tie, places)
            if rank not in holders:
                continue
            # One holder per copy contributes (each unit's synced gradient is the same on all of its holders).
            mine = [(c, min(d for p in places[c.unit] for d in p.devices) == rank) for c in tie.copies
                    if any(rank in p.devices for p in places[c.unit])]
            self.jobs.append((mine, groups.get(holders)))

    def sync(self, states: list) -> None:
        """``states``: this rank's units (wrap's _UnitState: unit.name, unit.module, proxies, shard)."""
        by_name = {st.unit.name: st for st in states}
        for mine, group in self.jobs:
            total = None
            for c, contributes in mine:
                full = _full_grad(by_name[c.unit], c.index)
                total = torch.zeros_like(full) if total is None else total
                if contributes:
                    total += full
            if group is not None:
                dist.all_reduce(total, group=group)
            for c, _ in mine:
                _set_grad(by_name[c.unit], c.index, total)


def _offset(shard, index: int) -> int:
    return sum(t.numel() for t in shard.tensors[:index])


def _full_grad(st, index: int) -> torch.Tensor:
    """The full gradient of parameter ``index`` of a unit (a collective over its shards, if sharded)."""
    if st.shard is not None:
        sh = st.shard
        g = sh.master.grad if sh.master.grad is not None else torch.zeros_like(sh.master)
        flat = torch.empty(sh.size * sh.world, dtype=g.dtype, device=g.device)
        dist.all_gather_single(flat, g.contiguous(), group=sh.group)
        t, off = sh.tensors[index], _offset(sh, index)
        return flat[off:off + t.numel()].view_as(t).clone()
    p, proxy = list(st.unit.module.parameters())[index], st.proxies[index]
    g = proxy.grad if proxy.grad is not None else torch.zeros_like(proxy)
    if isinstance(p, DTensor):
        return DTensor.from_local(g, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride()).full_tensor()
    return g.clone()


def _set_grad(st, index: int, total: torch.Tensor) -> None:
    """Write this rank's region of the summed full gradient where the optimizer reads it."""
    if st.shard is not None:
        sh = st.shard
        if sh.master.grad is None:
            sh.master.grad = torch.zeros_like(sh.master)
        off, n, base = _offset(sh, index), total.numel(), sh.index * sh.size
        lo, hi = max(off, base), min(off + n, base + sh.size)
        if lo < hi:
            sh.master.grad[lo - base:hi - base] = total.reshape(-1)[lo - off:hi - off]
        return
    p = list(st.unit.module.parameters())[index]
    region = _local_region(total, p.device_mesh, p.placements) if isinstance(p, DTensor) else total
    st.proxies[index].grad = region.clone()
