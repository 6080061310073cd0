"""The links of a group of ranks, and ``Collectives``: the one place that prices a collective over one.

A profile (``CostParams.comm_fit``) measures ``alpha + beta * bytes`` per collective and group size
inside one node. Where such a fit covers a group it replaces the formula, and since the measured
time already includes summing the buffers, GenModel's gamma term is then not added on top. Every
other group is priced by the alpha-beta formulas of ``cost_models.communication`` (NCCL's rings, trees) plus
the gamma term for the collectives that reduce, over its links at ``CostParams.link_efficiency`` of their
line rate (NCCL's rings reach about 80% of a link; a measured fit already includes what they reach).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike

from cost_models import communication as comm
from cost_models.params import CostParams

# Formula per collective, all with the signature of ``nccl_allgather_time``.
_FORMULA = {
    "allreduce": comm.hierarchical_allreduce_time,
    "allgather": comm.nccl_allgather_time,
    "reduce_scatter": comm.nccl_reduce_scatter_time,
}


@dataclass(frozen=True)
class GroupLinks:
    """Slowest links of a group of ranks (or of the worst of several equal groups), in SI units."""

    size: int
    n_local: int  # most ranks of the group on one node
    n_nodes: int
    intra_bw: float
    intra_lat: float
    inter_bw: float  # per-rank share of the network bandwidth
    inter_lat: float

    @property
    def slowest(self) -> tuple[float, float]:
        """(bandwidth, latency) of the slowest link any two ranks of the group use."""
        if self.n_nodes == 1:
            return self.intra_bw, self.intra_lat
        return min(self.intra_bw, self.inter_bw), max(self.intra_lat, self.inter_lat)

    def at_efficiency(self, efficiency: float) -> GroupLinks:
        """These links as a collective over them reaches them: bandwidths at ``efficiency`` of their line
        rate (``CostParams.link_efficiency``), latencies as they are."""
        return replace(self, intra_bw=self.intra_bw * efficiency, inter_bw=self.inter_bw * efficiency)


@dataclass(frozen=True)
class Collectives:
    """Collective times over groups of one stage: measured fit or formula, with or without gamma.

    ``hbm_bw``: bytes/s of the slowest participant's memory, which bounds the reduction (gamma) term.
    """

    params: CostParams
    hbm_bw: float

    def fit(self, collective: str, g: GroupLinks) -> tuple[float, float] | None:
        """The profile's (alpha s, beta s/byte) for this group: one node and a size it measured; else None."""
        if g.n_nodes == 1 and g.size > 1:
            return self.params.measured_comm(collective, g.size)
        return None

    def time(self, collective: str, nbytes: ArrayLike, g: GroupLinks) -> np.ndarray:
        """Wire time of ``collective`` ("allreduce", "allgather", "reduce_scatter") of ``nbytes`` over ``g``.

        ``nbytes`` counts as ``cost_models.communication`` does (all-reduce / reduce-scatter: the
        buffer each rank holds; all-gather: the gathered output). A measured fit where it covers the
        group, else the formula over the group's links at ``link_efficiency`` of their
        bandwidth plus the call's fixed cost (``CostParams.collective_call_s``); zero bytes (or a group of
        one) cost nothing either way.
        """
        fit = self.fit(collective, g)
        if fit is not None:
            b = np.asarray(nbytes, dtype=float)
            return np.where(b > 0, fit[0] + fit[1] * b, 0.0)
        g = g.at_efficiency(self.params.link_efficiency)  # line rates -> what NCCL's collectives reach on them
        wire = _FORMULA[collective](nbytes, g.n_local, g.n_nodes, g.intra_bw, g.intra_lat, g.inter_bw, g.inter_lat)
        call = self.params.collective_call_s
        return np.where(wire > 0, wire + call, 0.0) if call else wire

    def reduction(self, collective: str, nbytes: ArrayLike, g: GroupLinks) -> ArrayLike:
        """GenModel's gamma term of a reducing collective, or 0 where a measured fit already includes it."""
        if self.fit(collective, g) is not None:
            return 0.0
        return comm.reduction_time(nbytes, g.size, self.hbm_bw)

    def reduced(self, collective: str, nbytes: ArrayLike, g: GroupLinks) -> np.ndarray:
        """A reducing collective whole: its wire time or its reduction, whichever is longer.

        NCCL reduces each chunk as it arrives, in the kernel that forwards it (its ring's
        receive-reduce-send steps), so the reduction runs under the transfer and only shows where
        memory is the slower of the two. Measured on one 8x H200 node at 16 GiB, the reducing ring
        all-reduce and reduce-scatter reach the bus bandwidth of the all-gather, which reduces nothing
        (367.2 and 362.9 against 361.4 GB/s; stas00/ml-engineering network/README.md @ 744d01e1, "SHARP").
        """
        return np.maximum(self.time(collective, nbytes, g), self.reduction(collective, nbytes, g))
