"""Process groups and device meshes for a plan.

``dist.new_group`` must be called by every rank, for every group, in the same order. So every rank
derives the complete list of rank sets from the plan (pure, autopar.runtime.layout), de-duplicates
and sorts it, and creates each group once. Meshes are then built from existing groups with
``DeviceMesh.from_group``, which only the members call. Size-1 sets need no group.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autopar.runtime.layout import Layout, Placement

Ranks = tuple[int, ...]


def sync_groups(places: list[Placement]) -> tuple[str, dict[str, dict[tuple, Ranks]]]:
    """How a unit's gradients are synchronised across all its placements.

    Returns (mode, classes). ``aligned``: every placement shards the unit the same way, so devices
    holding the same region all-reduce their local gradients; classes["sharded"] (parameters split
    over TP) and classes["replicated"] (parameters every TP rank holds whole) map a region key to
    the sorted devices holding it. ``general``: placements shard differently (different tp, zero 3
    on some only, different stage sizes under zero 3); all holders all-reduce full-size gradients
    (classes["all"]).
    """
    first = places[0]
    aligned = all(p.strategy.tp == first.strategy.tp and p.fsdp == first.fsdp for p in places)
    if first.fsdp:
        aligned = aligned and all(len(p.devices) == len(first.devices) for p in places)
    if not aligned:
        holders = tuple(sorted(d for p in places for d in p.devices))
        return "general", {"all": {(): holders}}
    classes: dict[str, dict[tuple, list[int]]] = {"sharded": {}, "replicated": {}}
    for p in places:
        lay = p.layout
        for d in p.devices:
            fs = (lay.fsdp_coord(d),) if p.fsdp else ()
            classes["replicated"].setdefault(fs, []).append(d)
            if lay.tp > 1:
                classes["sharded"].setdefault(fs + (lay.tp_coord(d),), []).append(d)
    return "aligned", {c: {k: tuple(sorted(v)) for k, v in kv.items()} for c, kv in classes.items()}


def unit_rank_sets(places: list[Placement]) -> list[Ranks]:
    """Every rank set (size >= 2) the runtime needs for one unit: TP, CP, FSDP/ZeRO DP and sync groups."""
    sets: list[Ranks] = []
    for p in places:
        lay = p.layout
        for d in p.devices:
            if lay.tp > 1:
                sets.append(lay.tp_group(d))
            if lay.cp > 1:  # context parallel: K/V gathered over the replica's CP group
                sets.append(lay.cp_group(d))
            if p.zero > 0:  # ZeRO-1/2 shard groups; FSDP mesh columns (the whole stage when tp = 1)
                sets.append(lay.dp_group(d))
    _, classes = sync_groups(places)
    for kv in classes.values():
        sets.extend(kv.values())
    return [s for s in sets if len(s) > 1]


class Groups:
    """All process groups of a plan, created in one agreed order; looked up by their sorted rank set."""

    def __init__(self, rank_sets: list[Ranks], device_type: str) -> None:
        self.device_type = device_type
        self.rank = dist.get_rank()
        self._groups: dict[Ranks, dist.ProcessGroup] = {}
        self._meshes: dict[tuple, DeviceMesh] = {}
        for ranks in sorted({tuple(sorted(s)) for s in rank_sets if len(s) > 1}):
            g = dist.new_group(list(ranks))
            if self.rank in ranks:
                self._groups[ranks] = g

    def get(self, ranks: Ranks) -> dist.ProcessGroup | None:
        """The group of ``ranks`` (None for a single rank: nothing to communicate)."""
        ranks = tuple(sorted(ranks))
        if len(ranks) == 1:
            return None
        return self._groups[ranks]

    def mesh_1d(self, ranks: Ranks) -> DeviceMesh:
        ranks = tuple(sorted(ranks))
        key = ("1d", ranks)
        if key not in self._meshes:
            self._meshes[key] = DeviceMesh.from_group(self._groups[ranks], self.device_type)
        return self._meshes[key]

    def mesh_fsdp_tp(self, layout: Layout) -> DeviceMesh:
        """2-D ("dp", "tp") mesh of a stage: rows are TP groups, columns FSDP groups."""
        grid = layout.fsdp_grid()
        assert grid is not None, "checked by check_plan"
        key = ("2d", tuple(map(tuple, grid)))
        if key not in self._meshes:
            row = next(r for r in grid if self.rank in r)
            col = [r[row.index(self.rank)] for r in grid]
            self._meshes[key] = DeviceMesh.from_group([self._groups[tuple(col)], self._groups[tuple(row)]],
                                                      self.device_type, mesh=grid, mesh_dim_names=("dp", "tp"))
        return self._meshes[key]
