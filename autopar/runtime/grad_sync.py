"""Gradient synchronisation of one unit across every pipeline and DP rank that holds it.

Hand-written over explicit process groups instead of DDP: DDP hooks fire on every backward and
expect each replica to run the same number of backward passes over one group, while a plan gives
each unit its own group, pipelines run different numbers of micro-batches, and the same unit may
be sharded differently in different pipelines. So gradients accumulate locally over the whole
schedule and are summed once per step. (ZeRO-3 units first reduce-scatter inside their stage
through FSDP2; this then adds the other pipelines' contributions.)

Each micro-batch's loss is already weighted by its share of the global batch, so the global-batch
mean gradient is the plain *sum* of every distinct contribution. Copies must count once: a
parameter a TP group holds whole with a Replicate gradient contributes from TP coordinate 0 only,
while Partial gradients (sequence-parallel norms) and shards contribute from every rank.

Two modes (``groups.sync_groups``): *aligned* (all placements shard the unit alike) all-reduces the
local gradients among the holders of the same region; *general* (placements differ, e.g. tp 2 in one
pipeline and tp 1 in another) all-reduces full-size gradients among all holders and cuts each rank's
region back out with DTensor's own placement logic.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from autopar.runtime.groups import Groups, sync_groups
from autopar.runtime.layout import Placement


def _is_replicate(placement) -> bool:
    return isinstance(placement, Replicate)


class UnitGradSync:
    """Sums one unit's gradients on this rank with every other holder of the unit."""

    def __init__(self, module: nn.Module, places: list[Placement], mine: Placement, rank: int,
                 groups: Groups, tp_partial: set[str] = frozenset()) -> None:
        named = list(module.named_parameters())
        self.params = [p for _, p in named]
        # gradients each TP rank holds a part of (tensor_parallel.tp_partial_params): every TP rank contributes
        self.tp_partial = {i for i, (n, _) in enumerate(named) if n in tp_partial} if mine.layout.tp > 1 else set()
        self.mode, classes = sync_groups(places)
        self.rank, self.fsdp = rank, mine.fsdp
        lay = mine.layout
        self.tp = lay.tp
        self.tp_coord = lay.tp_coord(rank) if lay.tp > 1 else 0
        fs = (lay.fsdp_coord(rank),) if mine.fsdp else ()
        if self.mode == "general":
            self.all_group = groups.get(classes["all"][()])
            return
        rep = classes["replicated"][fs]
        self.rep_group = groups.get(rep)
        # Replicate gradients need summing only if another TP group (pipeline / DP rank) holds the region.
        self.rep_needs_sum = len(rep) // self.tp > 1
        self.shard_group = groups.get(classes["sharded"][fs + (self.tp_coord,)]) if self.tp > 1 else None
        self.rep_ranks = rep

    # -- helpers -----------------------------------------------------------------------------
    def _tp_dim(self, t: torch.Tensor) -> int | None:
        """Which dimension of ``t``'s mesh is the TP one (None: not a DTensor, or a DP-only FSDP mesh)."""
        if self.tp == 1 or not isinstance(t, DTensor):
            return None
        names = t.device_mesh.mesh_dim_names or ()
        if "tp" in names:
            return names.index("tp")
        return None if self.fsdp else 0  # FSDP's 1-D meshes are DP; a non-FSDP unit's 1-D mesh is its TP group

    def _tp_placement(self, grad: torch.Tensor):
        if self.tp == 1:
            return None
        dim = self._tp_dim(grad)
        # A parameter TP leaves alone (plain, or FSDP-sharded over DP only): every TP rank holds a copy.
        return Replicate() if dim is None else grad.placements[dim]

    @staticmethod
    def _local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    def _grads(self) -> list[torch.Tensor]:
        """Accumulated gradients laid out like their parameters.

        DTensor may hand back a gradient placed differently from its parameter (a vocabulary-parallel
        embedding's gradient arrives Replicate); it is redistributed to the parameter's placements
        (for Replicate -> Shard a local slice). Partial gradients of Replicate parameters
        (sequence-parallel norms) stay Partial: the sync's all-reduce sums them.
        """
        out = []
        for p in self.params:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            if isinstance(g, DTensor) and g.placements != p.placements:
                partial_of_replicate = all(gp.is_partial() and _is_replicate(pp) or gp == pp
                                           for gp, pp in zip(g.placements, p.placements))
                if not partial_of_replicate:
                    g = g.redistribute(p.device_mesh, p.placements)
            out.append(g)
        return out

    # -- the sync ----------------------------------------------------------------------------
    def sync(self) -> list[torch.Tensor]:
        """Synchronised local gradients of every parameter (plain tensors, parameter order)."""
        if not self.params:
            return []
        grads = self._grads()
        if self.mode == "general":
            return self._sync_general(grads)
        out: list[torch.Tensor | None] = [None] * len(grads)
        buckets: dict[str, list[int]] = {"sharded": [], "replicated": [], "partial": []}
        for i, g in enumerate(grads):
            pl = self._tp_placement(g)
            if i in self.tp_partial:
                buckets["partial"].append(i)
            elif pl is None or _is_replicate(pl):
                buckets["replicated"].append(i)
            elif pl.is_shard():
                buckets["sharded"].append(i)
            else:
                buckets["partial"].append(i)
        self._reduce([grads[i] for i in buckets["sharded"]], buckets["sharded"], out, self.shard_group, True)
        contributes = self.tp_coord == 0
        if self.rep_needs_sum:
            self._reduce([grads[i] for i in buckets["replicated"]], buckets["replicated"], out, self.rep_group,
                         contributes)
        else:
            for i in buckets["replicated"]:
                out[i] = self._local(grads[i])
        self._reduce([grads[i] for i in buckets["partial"]], buckets["partial"], out, self.rep_group, True)
        return out

    def _reduce(self, grads: list[torch.Tensor], idx: list[int], out: list, group, contributes: bool) -> None:
        if not grads:
            return
        locs = [self._local(g) for g in grads]
        if group is None:
            for i, t in zip(idx, locs):
                out[i] = t
            return
        flat = torch.cat([t.reshape(-1) for t in locs])
        if not contributes:
            flat = torch.zeros_like(flat)
        dist.all_reduce(flat, group=group)
        offset = 0
        for i, t in zip(idx, locs):
            out[i] = flat[offset:offset + t.numel()].view_as(t)
            offset += t.numel()

    def _sync_general(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        fulls, meshes = [], []
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if isinstance(g, DTensor):
                full = g.full_tensor()  # every holder of the mesh now has the same full gradient
                coord = g.device_mesh.get_coordinate()
                contributes = all(c == 0 for c in coord) and (self._tp_dim(g) is not None or self.tp_coord == 0
                                                              or i in self.tp_partial)
                meshes.append((g.device_mesh, p.placements))
            else:
                full = g
                contributes = self.tp_coord == 0 or i in self.tp_partial
                meshes.append(None)
            fulls.append(full if contributes else torch.zeros_like(full))
        flat = torch.cat([f.reshape(-1) for f in fulls])
        if self.all_group is not None:
            dist.all_reduce(flat, group=self.all_group)
        out, offset = [], 0
        for f, mp in zip(fulls, meshes):
            full = flat[offset:offset + f.numel()].view_as(f)
            offset += f.numel()
            out.append(full if mp is None else _local_region(full, *mp))
        return out


def _local_region(full: torch.Tensor, mesh: DeviceMesh, placements) -> torch.Tensor:
    """This rank's part of a full tensor under ``placements`` (local slicing, no communication)."""
    rep = DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return rep.redistribute(mesh, placements).to_local()
