"""What the cost model charges a measured unit call besides compute, so the compute fit takes off exactly that.

A profiled unit's forward + backward includes its communication. The cost model adds, per micro-batch,
the TP collectives (all-reduces, and SP's gather of the unit's output) and the ZeRO traffic that
prefetching does not hide behind compute. ``MachineComm.charged_s`` prices those with the cost model's
own terms (``cost_models.layer``: ``tp_comm_times``, ``dp_comm_times``, ``zero_exposed``) through the
profile's own ``Collectives`` (its measured fits, its link, its bytes and overlap), so the compute
curve is fitted to what the estimate will add compute to.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from autopar.modelspec.spec import LayerSpec
from cost_models import CostParams
from cost_models.collectives import Collectives, GroupLinks
from cost_models.layer import CKPT_CODE, dp_comm_times, tp_comm_times
from cost_models.zero_options import zero_exposed

COMM_FIT_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")
_BISECTIONS = 60  # halvings of the compute interval when overlap makes the exposed traffic depend on it


def overlap_zero3(device: str) -> float:
    """Fraction of compute that hides ZeRO-3 traffic: FSDP2 prefetches on its own CUDA stream; on CPU the
    gloo collectives run on the cores that compute, so nothing hides."""
    return 0.0 if device == "cpu" else 1.0


def comm_fields(fits: dict, dtype_bytes: int, device: str) -> dict:
    """The CostParams fields a profile sets that price communication (``comm_fit``, bytes, overlap)."""
    return {
        "comm_fit": [[c, int(n), f[c]["alpha_s"], f[c]["beta_s_per_byte"]]
                     for n, f in sorted(fits.items()) for c in COMM_FIT_COLLECTIVES],
        "param_bytes": dtype_bytes, "grad_comm_bytes": dtype_bytes,
        "link_efficiency": 1.0,  # the profile's link is measured: what the collectives reach, not a line rate
        # its latency is a measured call's (p2p alpha), fixed cost included: none charged on top of it
        "collective_call_s": 0.0,
        "overlap_zero3": overlap_zero3(device),
        # the distributed optimizer's overlapped collectives run on the same gloo threads: as ZeRO-3's
        "overlap_grad_reduce": overlap_zero3(device), "overlap_param_gather": overlap_zero3(device),
    }


@dataclass(frozen=True)
class MachineComm:
    """The profiled machine's groups as the cost model prices them (as ``apply_profile`` makes its cluster)."""

    params: CostParams  # the profile's communication fields
    hbm_bw: float  # measured copy bandwidth (the gamma term's, where no fit covers a group)
    link_bw: float  # measured point-to-point link: every group of the profiled machine is on one node
    link_lat: float
    world: int  # ranks of the profiling job: the data-parallel group is all of them over tp

    @classmethod
    def of(cls, comm: dict, dtype_bytes: int, device: str, hbm_bw: float, world: int) -> MachineComm:
        """From the profile's communication part (fits and link) and the measured copy bandwidth."""
        link = comm.get("link") or {"bw_gbps": float("inf"), "lat_us": 0.0}  # no link: no groups to price
        params = CostParams(**comm_fields(comm.get("fits", {}), dtype_bytes, device))
        return cls(params, hbm_bw, link["bw_gbps"] * 1e9, link["lat_us"] * 1e-6, world)

    @cached_property
    def collectives(self) -> Collectives:
        return Collectives(self.params, self.hbm_bw)

    def links(self, size: int) -> GroupLinks:
        """A group of ``size`` ranks of this one-node machine."""
        return GroupLinks(size, size, 1, self.link_bw, self.link_lat, self.link_bw, self.link_lat)

    def charged_s(self, ly: LayerSpec, row: dict) -> float:
        """Seconds of communication the cost model adds to one measured forward + backward (``row``).

        ``row``: a compute sample (``mbs`` rows per rank, ``tp``, ``ckpt``, ``zero``, ``fwd_s``, ``bwd_s``,
        ``flops_per_rank``, ``recompute_flops``). TP terms do not depend on compute. ZeRO's exposed
        traffic does, once compute may hide it: then the compute c solving ``c + exposed(c) = measured``
        is found (exposed(c) never falls faster than c grows), with compute split between forward and
        backward by FLOPs (forward F, backward 2F + R), and what the model adds at that c is returned.
        """
        tp = np.array([float(row["tp"])])
        zero = np.array([int(row.get("zero", 0))])
        ckpt = np.array([CKPT_CODE[row["ckpt"]]])
        sp = np.array([bool(row.get("sp", False))])
        b_local = np.array([float(row["mbs"])])
        coll = self.collectives
        tp_fwd, tp_bwd = tp_comm_times(ly, tp, sp, ckpt, b_local, self.links, coll)
        tp_s = float(tp_fwd[0] + tp_bwd[0])
        if zero[0] < 2:
            return tp_s  # ZeRO-0/1 move nothing per micro-batch (their sync is step-level)
        _, ag, rs = dp_comm_times(ly, tp, lambda t: self.links(self.world // t), coll, self.params)
        F, R = row.get("flops_per_rank", row["flops"]), row.get("recompute_flops", 0.0)
        fwd_share = F / (3 * F + R) if 3 * F + R > 0 else 1 / 3

        def exposed(c: float) -> float:
            f = np.array([c * fwd_share])
            zf, zb = zero_exposed(f, c - f, ag, rs, zero, self.params.overlap_zero3, self.params.zero3_comm_eff)
            return float(zf[0] + zb[0])

        measured = row["fwd_s"] + row["bwd_s"] - tp_s
        lo, hi = 0.0, max(measured, 0.0)
        if lo + exposed(lo) < measured:
            for _ in range(_BISECTIONS):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if mid + exposed(mid) < measured else (lo, mid)
            lo = hi
        return tp_s + exposed(lo)
