"""Which unit of a traced model holds which parameters: each tensor once, at the first unit that runs with
it, and the ties between units (a tensor two units use, such as tied embeddings) counted on both sides."""

from __future__ import annotations

from torch import nn


def unit_ties(units, order: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """(tied, shared) parameter counts per unit: what a unit uses of an earlier unit's tensors (the runtime's
    copy, ``LayerSpec.tied_params``) and what of its own a later unit uses (``LayerSpec.shared_params``)."""
    owner = owners(units, order)
    first: dict[int, str] = {}
    tied = dict.fromkeys(order, 0)
    shared = dict.fromkeys(order, 0)
    counted: set[int] = set()
    for n, m in in_run_order(units, order):
        for p in m.parameters():  # each tensor once per unit (remove_duplicate)
            o = first.setdefault(id(p), owner[n])
            if o != owner[n]:
                tied[owner[n]] += p.numel()
                if id(p) not in counted:
                    counted.add(id(p))
                    shared[o] += p.numel()
    return tied, shared


def in_run_order(units, order: list[str]) -> list:
    """``units`` ((name, module) pairs) in the order they ran (``order``), those that never ran last (stable)."""
    rank = {n: i for i, n in enumerate(order)}
    return sorted(units, key=lambda u: rank.get(u[0], len(rank)))


def owners(units, order: list[str]) -> dict[str, str]:
    """Each unit's owner: itself if it ran, else the preceding unit (registration order) that did."""
    ran = set(order)
    owner: dict[str, str] = {}
    prev = order[0]
    for n, _ in units:
        if n in ran:
            prev = n
        owner[n] = prev
    return owner


def unit_params(module: nn.Module, units, order: list[str]) -> dict[str, list[nn.Parameter]]:
    """Each parameter once, by unit: first runner of a tied weight; root's own -> first unit; unused -> previous."""
    owner = owners(units, order)
    seen: set[int] = set()
    out: dict[str, list[nn.Parameter]] = {n: [] for n in order}
    for n, m in in_run_order(units, order):
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out[owner[n]].append(p)
    for p in module.parameters(recurse=False):
        if id(p) not in seen:
            seen.add(id(p))
            out[order[0]].append(p)
    return out
