"""Materialise a rank's units one at a time, every rank hearing of any rank's failure before it waits.

``wrap`` builds a unit (materialise, then TP / FSDP, whose set-up talks to the unit's group) before it
materialises the next, so a rank holds at most one whole unit beside its shards. Materialising a
meta-device unit can fail on one rank only (an init function leaving a tensor unset in a unit only
that stage holds); its peers would then wait in the next unit's TP / FSDP collectives until the
timeout. So when the model is on the meta device every rank goes through the same number of rounds
(the most units any rank holds, from the plan alone), and each round ends in ``agree``: a collective
over the world that raises, the same one line on every rank, if any rank failed to materialise its
unit of that round. TP and FSDP groups never span stages and the ranks of one stage hold the same
units, so the build collectives between rounds only involve ranks in the same round.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch import nn

from autopar.plan.schema import Plan
from autopar.runtime.agreement import agree
from autopar.runtime.chunks import rank_chunks
from autopar.runtime.materialize import InitFn, materialize_unit, tied_values
from autopar.runtime.ties import Tie


def units_per_rank(plan: Plan, world: int) -> list[int]:
    """How many units each rank runs (all of its chunks), by rank."""
    out = []
    for rank in range(world):
        pi, chunks = rank_chunks(plan, rank)
        out.append(sum(len(plan.pipelines[pi].stages[si].layers) for si in chunks))
    return out


def tie_sources(ties: list[Tie], named: list[tuple[str, nn.Module]]) -> dict[str, list[tuple[int, str, nn.Module, int]]]:
    """Unit -> (its parameter index, the tied tensor's first unit, a meta copy of that unit, the
    tensor's index there) for every copy of a tied tensor after the first; taken while the units are
    still on the meta device (each rank then materialises the first unit's value, as init_weights)."""
    modules = dict(named)
    out: dict[str, list[tuple[int, str, nn.Module, int]]] = {}
    metas: dict[str, nn.Module] = {}
    for tie in ties:
        first = tie.copies[0]
        if first.unit not in metas:
            metas[first.unit] = copy.deepcopy(modules[first.unit])
        for c in tie.copies[1:]:
            out.setdefault(c.unit, []).append((c.index, first.unit, metas[first.unit], first.index))
    return out


def _materialize(name: str, module: nn.Module, seed: int, device: torch.device, init_fn: InitFn | None,
                 sources: list[tuple[int, str, nn.Module, int]]) -> nn.Module:
    module = materialize_unit(module, name, seed, device, init_fn)
    params = list(module.parameters())
    with torch.no_grad():
        for index, value in tied_values(sources, seed, init_fn):
            params[index].copy_(value.to(device))
    return module


def materialized(mine: list[tuple[str, nn.Module]], plan: Plan, world: int, meta: bool, seed: int,
                 device: torch.device, init_fn: InitFn | None,
                 ties: dict[str, list[tuple[int, str, nn.Module, int]]] | None = None) -> Iterator[nn.Module]:
    """This rank's units, materialised on ``device`` one per iteration (the caller builds each before
    asking for the next). ``meta`` (the same on every rank: wrap agrees on it): run in lockstep rounds
    over the world, raising on every rank if any rank's materialisation failed. ``ties``
    (``tie_sources``): the copies of tied tensors get their first unit's value."""
    ties = ties or {}
    if not meta:
        for name, module in mine:
            yield materialize_unit(module, name, seed, device, init_fn)
        return
    for i in range(max(units_per_rank(plan, world))):
        module, error = None, None
        if i < len(mine):
            name, module = mine[i]
            try:
                module = _materialize(name, module, seed, device, init_fn, ties.get(name, []))
            except Exception as e:  # noqa: BLE001  (reported to every rank by agree)
                error = e
        agree(None, error)
        if module is not None:
            yield module
