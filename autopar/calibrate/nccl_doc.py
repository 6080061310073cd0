"""``autopar calibrate --nccl-tests``: the reference the tables are compared with, the calibration's
communication part and the printed summary.

The reference is what the estimate would assume without the measurements: the links of ``--cluster``
(a preset, inline spec or cluster file), else the catalogue's defaults for the GPU the tables name
(``--gpu`` where nccl-tests' device name is not a catalogue name). The calibration then holds::

    cost_params: {comm_fit: [[collective, GPUs, alpha_s, beta_s_per_byte], ...]}   (one-host tables)
    communication: {link: {bw_gbps, lat_us}, inter_link: {bw_gbps, lat_us}}        (where measured)
    nccl_tests: per table its file, layout, own alpha-beta fit, what it set, and the measured,
                calibrated and reference seconds at three sizes (smallest, middle, largest)

which ``--profile`` applies through ``autopar.profile.apply_profile`` (the links onto every node and
the network, the rows into the cost parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.calibrate.nccl_fit import Links, NcclCalibration, calibrate_tables, charged
from autopar.calibrate.nccl_tests import NcclTable, read_nccl_tests
from autopar.cluster import catalogue
from autopar.cluster.parse import load_cluster
from autopar.errors import AutoparError
from cost_models import CostParams


@dataclass(frozen=True)
class Reference:
    """The GPU the calibration is for (a catalogue or cluster-file name), its links and memory bandwidth."""

    gpu: str
    links: Links
    hbm_gbps: float
    what: str  # e.g. "cluster 2x8xA100-40G" or "catalogue defaults of A100-40G"


def reference(tables: list[NcclTable], cluster: str | None, gpu: str | None) -> Reference:
    """The reference of ``tables`` (module docstring); AutoparError naming the option when the GPU the
    tables measured is not the cluster's, or is unknown and neither ``--gpu`` nor ``--cluster`` names it."""
    names = sorted({t.gpu for t in tables})
    canon = {n: catalogue.lookup(n) for n in names}
    if cluster is not None and gpu is not None:
        raise AutoparError("--gpu", "and --cluster both name the GPU", "give one of them (the cluster names its GPU)")
    if cluster is not None:
        cl = load_cluster(cluster)
        types = sorted({nd.gpu.name for nd in cl.nodes})
        if len(types) > 1:
            raise AutoparError("--cluster", f"{cl.describe()} mixes {', '.join(types)}",
                               "compare the measurements with a cluster of the GPU they ran on")
        for n, c in canon.items():
            if c is not None and c != types[0]:
                raise AutoparError("--cluster", f"has {types[0]} but the tables measured {n}"
                                   f"{f' ({c})' if c else ''}", "give the cluster the measurements ran on")
        nd = cl.nodes[0]
        return Reference(types[0], Links.of(cl), nd.gpu.hbm_bw / 1e9, f"cluster {cl.describe()}")
    if gpu is not None:
        g = catalogue.gpu(gpu, "--gpu")
    else:
        unknown = [n for n, c in canon.items() if c is None]
        if unknown:
            raise AutoparError("--gpu", f"the tables measured {unknown[0]!r}, which is not in the GPU catalogue",
                               "name it: --gpu NAME (autopar list gpus), or --cluster FILE defining it")
        if len(set(canon.values())) > 1:
            raise AutoparError("--nccl-tests", f"the tables measured different GPUs: {', '.join(names)}",
                               "calibrate one GPU type at a time")
        g = catalogue.gpu(next(iter(canon.values())))
    d = catalogue.node_defaults(g)
    return Reference(g.name, Links(d.intra_bw_gbps, d.intra_lat_us, d.inter_bw_gbps, d.inter_lat_us), g.hbm_bw / 1e9,
                     f"catalogue defaults of {g.name}")


def load_tables(specs: list[str]) -> list[NcclTable]:
    """Every run of every ``--nccl-tests`` argument (``nccl_tests.read_nccl_tests``)."""
    return [t for s in specs for t in read_nccl_tests(s)]


def _checks(t: NcclTable, ref: Reference, cal: NcclCalibration) -> list[dict]:
    """Measured, calibrated and reference seconds at the smallest, a middle and the largest size."""
    rows = sorted(t.rows, key=lambda r: r.size)
    pick = [rows[0], rows[len(rows) // 2], rows[-1]] if len(rows) >= 3 else rows
    sizes = [r.size for r in pick]
    calibrated = charged(t, sizes, cal.links(ref.links), cal.params(CostParams()), ref.hbm_gbps)
    assumed = charged(t, sizes, ref.links, CostParams(), ref.hbm_gbps)
    return [{"size": r.size, "measured_s": r.time_s, "calibrated_s": float(c), "reference_s": float(a)}
            for r, c, a in zip(pick, calibrated, assumed)]


def nccl_calibration(specs: list[str], cluster: str | None, gpu: str | None) -> tuple[dict, Reference]:
    """(the calibration's communication part: ``gpus``, ``cost_params``, ``communication``, ``nccl_tests``,
    ``reference``; its Reference) from the ``--nccl-tests`` files."""
    tables = load_tables(specs)
    ref = reference(tables, cluster, gpu)
    cal = calibrate_tables(tables, ref.links, ref.hbm_gbps)
    communication = {k: {"bw_gbps": v["bw_gbps"], "lat_us": v["lat_us"]}
                     for k, v in (("link", cal.link), ("inter_link", cal.inter_link)) if v}
    per_table = []
    for f in cal.fits:
        t = f.table
        per_table.append({
            "path": t.path, "collective": t.collective, "gpus": t.ranks, "hosts": t.n_nodes, "per_host": t.n_local,
            "device": t.gpu, "sizes": len(t.rows), "alpha_s": f.alpha_s, "beta_s_per_byte": f.beta_s_per_byte,
            "busbw_gbps": f.busbw_gbps, "rel_rms": f.rel_rms, "avg_busbw_gbps": t.avg_busbw_gbps,
            "applied": f.applied, "checks": _checks(t, ref, cal)})
    rl = ref.links
    doc = {"gpus": [ref.gpu], "cost_params": {"comm_fit": cal.comm_fit} if cal.comm_fit else {},
           "communication": communication, "nccl_tests": per_table,
           "reference": {"what": ref.what, "intra_bw_gbps": rl.intra_bw_gbps, "intra_lat_us": rl.intra_lat_us,
                         "inter_bw_gbps": rl.inter_bw_gbps, "inter_lat_us": rl.inter_lat_us},
           "fit_quality": {"link": cal.link, "inter_link": cal.inter_link,
                           "comm_fit": [{"collective": c, "gpus": n, "rel_rms": r}
                                        for (c, n), r in sorted(cal.comm_fit_rms.items())]}}
    return doc, ref


def _size(b: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):g} {unit}"
    return f"{b} B"


def _us(s: float) -> str:
    return f"{s * 1e6:,.1f} us"


def nccl_summary(doc: dict) -> str:
    """What ``autopar calibrate --nccl-tests`` prints: per table its fitted latency and bus bandwidth
    against the reference's links, what it set, and measured / calibrated / reference times at 3 sizes."""
    ref = doc["reference"]
    lines = [f"nccl-tests: {len(doc['nccl_tests'])} table(s) of {', '.join(doc['gpus'])}; reference: {ref['what']} "
             f"(intra-node {ref['intra_bw_gbps']:g} GB/s, {ref['intra_lat_us']:g} us; inter-node "
             f"{ref['inter_bw_gbps']:g} GB/s per node, {ref['inter_lat_us']:g} us)"]
    for t in doc["nccl_tests"]:
        where = "1 host" if t["hosts"] == 1 else f"{t['hosts']} hosts x {t['per_host']}"
        link = ("intra" if t["hosts"] == 1 else "inter")
        assumed_bw, assumed_lat = ref[f"{link}_bw_gbps"], ref[f"{link}_lat_us"]
        lines.append(f"  {t['collective']} over {t['gpus']} GPUs ({where}), {t['path']}: latency "
                     f"{t['alpha_s'] * 1e6:.3g} us, bus bandwidth {t['busbw_gbps']:.4g} GB/s (fit rms "
                     f"{100 * t['rel_rms']:.0f}%); reference {link}-node link {assumed_bw:g} GB/s, {assumed_lat:g} us")
        lines.append(f"    set: {t['applied'] or 'nothing'}")
        lines.append(f"    {'size':>10} {'measured':>13} {'calibrated':>13} {'reference':>13}")
        for c in t["checks"]:
            lines.append(f"    {_size(c['size']):>10} {_us(c['measured_s']):>13} {_us(c['calibrated_s']):>13} "
                         f"{_us(c['reference_s']):>13}")
    bad = [f"{k} {100 * v['rel_rms']:.0f}%" for k, v in doc["fit_quality"].items()
           if isinstance(v, dict) and v.get("rel_rms", 0) > 0.15]
    if bad:
        lines.append("note: the cost model's formulas match these measurements only to rms " + ", ".join(bad)
                     + " (see calibrated vs measured above)")
    return "\n".join(lines)

