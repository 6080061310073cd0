"""Measured collective times (nccl-tests tables) into the cost model: ``comm_fit`` rows and link overrides.

Every table is first fitted with ``t = alpha + beta * size`` (``alpha_beta``): scipy least squares on
``log(predicted / measured)`` with a soft-L1 loss, so the small sizes fix alpha, the large ones beta,
and a protocol switch in between (NCCL's LL / LL128 / Simple) does not pull the line. Its bus bandwidth
is NCCL's (doc/PERFORMANCE.md): ``size / beta`` times 2(n-1)/n for an all-reduce, (n-1)/n for an
all-gather, reduce-scatter or all-to-all, 1 for sendrecv, so it compares with a link's bandwidth.

What the cost model then uses (``calibrate_tables``), each priced afterwards exactly as the estimate
prices it (``charged``: ``cost_models.collectives.Collectives`` for the three collectives, the link
formulas of ``cost_models.communication`` for sendrecv and all-to-all):

* one host, all-reduce / all-gather / reduce-scatter: a ``CostParams.comm_fit`` row (collective, GPUs,
  alpha, beta), pooled over the tables of that collective and size; it replaces the formula for groups
  of that size inside one node, as a profile's measured rows do;
* one host, sendrecv / all-to-all: the intra-node link (GB/s, us), fitted through their formulas;
* several hosts, any of the five: the inter-node link (GB/s per node, us), fitted through the
  hierarchical formulas with the intra-node link (the fitted one, else the reference cluster's);
  sendrecv over hosts only with one GPU per host (with more, one rank's share of the NIC is unknown).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import least_squares

from autopar.calibrate.nccl_tests import NcclTable
from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from cost_models import CostParams
from cost_models import communication as comm
from cost_models.collectives import Collectives, GroupLinks

FIT_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")  # what CostParams.comm_fit prices
LINK_BOUNDS = ((1e-3, 1e5), (1e-3, 1e6))  # GB/s, us: what a link fit may return


def bus_factor(collective: str, n: int) -> float:
    """NCCL's busbw / algbw for ``collective`` over ``n`` ranks (nccl-tests doc/PERFORMANCE.md)."""
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    return 1.0 if collective == "sendrecv" else (n - 1) / n


def _points(tables: list[NcclTable]) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.array([r.size for t in tables for r in t.rows], dtype=float)
    return sizes, np.array([r.time_s for t in tables for r in t.rows], dtype=float)


def _rel_rms(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred / meas - 1.0) ** 2)))


def alpha_beta(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float, float]:
    """(alpha s, beta s/byte, rms relative error) of ``times ~ alpha + beta * sizes`` (module docstring)."""
    order = np.argsort(sizes)
    a0 = float(np.min(times[order[:3]]))
    b0 = max(float((times[order[-1]] - a0) / sizes[order[-1]]), 1e-15)
    res = least_squares(lambda u: np.log((np.exp(u[0]) + np.exp(u[1]) * sizes) / times),
                        np.log([max(a0, 1e-9), b0]), loss="soft_l1", f_scale=0.05)
    alpha, beta = float(np.exp(res.x[0])), float(np.exp(res.x[1]))
    return alpha, beta, _rel_rms(alpha + beta * sizes, times)


@dataclass(frozen=True)
class Links:
    """The links a group is priced over: intra-node (GB/s, us) and inter-node (GB/s per node, us)."""

    intra_bw_gbps: float
    intra_lat_us: float
    inter_bw_gbps: float
    inter_lat_us: float

    @classmethod
    def of(cls, cluster: Cluster) -> Links:
        """The first node's fabric and the cluster's network (the calibration's clusters are of one GPU type)."""
        nd = cluster.nodes[0]
        return cls(nd.intra_bw / 1e9, nd.intra_lat_us, cluster.inter_bw_gbps, cluster.inter_lat_us)


def charged(table: NcclTable, sizes, links: Links, params: CostParams, hbm_gbps: float) -> np.ndarray:
    """Seconds the estimate charges ``table``'s collective of ``sizes`` bytes over its GPUs and hosts."""
    nl, nn = table.n_local, table.n_nodes
    g = GroupLinks(table.ranks, nl, nn, links.intra_bw_gbps * 1e9, links.intra_lat_us * 1e-6,
                   links.inter_bw_gbps * 1e9 / nl if nn > 1 else float("inf"), links.inter_lat_us * 1e-6 if nn > 1 else 0.0)
    b = np.asarray(sizes, dtype=float)
    if table.collective in FIT_COLLECTIVES:
        coll = Collectives(params, hbm_gbps * 1e9)
        return coll.time(table.collective, b, g) if table.collective == "allgather" else coll.reduced(
            table.collective, b, g)
    bw, lat = g.slowest
    if table.collective == "sendrecv":
        return comm.p2p_time(b, bw, lat)
    return comm.alltoall_time(b, table.ranks, bw, lat)


def _fit_link(tables: list[NcclTable], links: Links, inter: bool, hbm_gbps: float) -> tuple[float, float, float]:
    """(GB/s, us, rms relative error) of the intra-node (``inter`` False) or inter-node link that makes
    ``charged`` match the tables (log residuals, soft-L1), the other link held at ``links``."""
    meas = [np.array([r.time_s for r in t.rows]) for t in tables]
    params = CostParams()  # no comm_fit: the formulas, which is what these groups are priced by

    def with_(u) -> Links:
        bw, lat = float(np.exp(u[0])), float(np.exp(u[1]))
        return replace(links, inter_bw_gbps=bw, inter_lat_us=lat) if inter else replace(
            links, intra_bw_gbps=bw, intra_lat_us=lat)

    def resid(u):
        lk = with_(u)
        return np.concatenate([np.log(charged(t, [r.size for r in t.rows], lk, params, hbm_gbps) / m)
                               for t, m in zip(tables, meas)])

    start = (links.inter_bw_gbps, max(links.inter_lat_us, 0.1)) if inter else (links.intra_bw_gbps,
                                                                               max(links.intra_lat_us, 0.1))
    lo, hi = np.log([LINK_BOUNDS[0][0], LINK_BOUNDS[1][0]]), np.log([LINK_BOUNDS[0][1], LINK_BOUNDS[1][1]])
    u0 = np.clip(np.log(start), lo, hi)
    res = least_squares(resid, u0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05)
    lk = with_(res.x)
    pred = np.concatenate([charged(t, [r.size for r in t.rows], lk, params, hbm_gbps) for t in tables])
    bw, lat = (lk.inter_bw_gbps, lk.inter_lat_us) if inter else (lk.intra_bw_gbps, lk.intra_lat_us)
    return bw, lat, _rel_rms(pred, np.concatenate(meas))


@dataclass
class TableFit:
    """One table's own alpha-beta fit and what the calibration made of it (``applied``)."""

    table: NcclTable
    alpha_s: float
    beta_s_per_byte: float
    rel_rms: float
    applied: str = ""

    @property
    def busbw_gbps(self) -> float:
        return bus_factor(self.table.collective, self.table.ranks) / self.beta_s_per_byte / 1e9


@dataclass
class NcclCalibration:
    """What the tables set: ``comm_fit`` rows, the intra- and inter-node links (None: not measured)."""

    fits: list[TableFit]
    comm_fit: list[list] = field(default_factory=list)  # [collective, GPUs, alpha_s, beta_s_per_byte]
    comm_fit_rms: dict = field(default_factory=dict)  # (collective, GPUs) -> rms relative error
    link: dict | None = None  # {bw_gbps, lat_us, rel_rms}: intra-node
    inter_link: dict | None = None  # {bw_gbps, lat_us, rel_rms}: between nodes, per node

    def links(self, reference: Links) -> Links:
        """``reference`` with the measured links in place."""
        out = reference
        if self.link:
            out = replace(out, intra_bw_gbps=self.link["bw_gbps"], intra_lat_us=self.link["lat_us"])
        if self.inter_link:
            out = replace(out, inter_bw_gbps=self.inter_link["bw_gbps"], inter_lat_us=self.inter_link["lat_us"])
        return out

    def params(self, base: CostParams) -> CostParams:
        return replace(base, comm_fit=tuple(tuple(r) for r in self.comm_fit)) if self.comm_fit else base


def calibrate_tables(tables: list[NcclTable], reference: Links, hbm_gbps: float) -> NcclCalibration:
    """Fit ``tables`` (module docstring); ``reference``: the links of the cluster the tables are compared
    with, whose intra-node link prices multi-host tables where no one-host sendrecv / all-to-all measured
    it; ``hbm_gbps``: the GPU's memory bandwidth (the gamma term of the formulas)."""
    fits = [TableFit(t, *alpha_beta(*_points([t]))) for t in tables]
    cal = NcclCalibration(fits)
    groups: dict[tuple[str, int], list[TableFit]] = {}
    for f in fits:
        t = f.table
        if t.n_nodes == 1 and t.collective in FIT_COLLECTIVES:
            groups.setdefault((t.collective, t.ranks), []).append(f)
        elif t.n_nodes > 1 and t.collective == "sendrecv" and t.n_local > 1:
            raise AutoparError(f"{t.path} devices", f"sendrecv over {t.n_nodes} hosts with {t.n_local} GPUs on each: "
                               "how much of a host's network one rank got is unknown",
                               "measure sendrecv over hosts with one GPU per host")
    for (c, n), members in sorted(groups.items()):
        alpha, beta, rms = alpha_beta(*_points([f.table for f in members]))
        cal.comm_fit.append([c, n, alpha, beta])
        cal.comm_fit_rms[(c, n)] = rms
        for f in members:
            f.applied = f"comm_fit row ({c}, {n} GPUs): {alpha * 1e6:.3g} us + bytes / {1 / beta / 1e9:.4g} GB/s"
    intra = [f for f in fits if f.table.n_nodes == 1 and f.table.collective not in FIT_COLLECTIVES]
    if intra:
        bw, lat, rms = _fit_link([f.table for f in intra], reference, False, hbm_gbps)
        cal.link = {"bw_gbps": bw, "lat_us": lat, "rel_rms": rms}
        for f in intra:
            f.applied = f"intra-node link {bw:.4g} GB/s, {lat:.3g} us"
    inter = [f for f in fits if f.table.n_nodes > 1]
    if inter:
        bw, lat, rms = _fit_link([f.table for f in inter], cal.links(reference), True, hbm_gbps)
        cal.inter_link = {"bw_gbps": bw, "lat_us": lat, "rel_rms": rms}
        for f in inter:
            f.applied = f"inter-node link {bw:.4g} GB/s per node, {lat:.3g} us"
    return cal
