"""Collective fidelity: the cost model's price of one NCCL collective against public measurements.

Reads every ``autopar-collectives/1`` file in ``benchmarks/data/collectives/`` (tables of one collective
over the GPUs of one or more nodes, payload -> elapsed time or nccl-tests bus bandwidth; the format is
described at the top of each file), builds the nodes from the catalogue (``autopar.cluster.load_cluster``:
its link bandwidth and latency, as a plan on that GPU gets them) and prices every row as the estimate
prices a collective over a stage of those GPUs (``StageContext.stage_links``, ``Collectives.time``: the
wire time a TP all-reduce is charged; the default ``CostParams``, so ``link_efficiency`` included). Beside
it, the same formula at the link's line rate (``link_efficiency`` 1), the model before that factor.

Per table: predicted / measured per row, and MAPE over the rows of three payload bands (< 1 MiB: latency
bound; 1-64 MiB: the TP all-reduces of training; >= 64 MiB: bandwidth bound, gradient syncs). Rows NCCL ran
with NVLink SHARP (``nvls``: reduced inside the NVSwitch, busbw above the link) are scored apart: the
model has no NVLS term, so they show what it leaves out.

    python benchmarks/collective_fidelity.py   # prints the tables, writes results/collective_fidelity.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import yaml

from autopar.calibrate.nccl_fit import bus_factor
from autopar.cluster import load_cluster
from autopar.estimate import StageContext
from cost_models import CostParams

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "collectives"
MIB = 1 << 20
BANDS = (("< 1 MiB", 0, MIB), ("1-64 MiB", MIB, 64 * MIB), (">= 64 MiB", 64 * MIB, float("inf")))


def measured_us(unit: str, collective: str, n: int, size: float, value: float) -> float:
    """The row's elapsed time in us: as published, or from nccl-tests busbw (GB/s) through its bus factor."""
    if unit == "time_us":
        return value
    return size * bus_factor(collective, n) / (value * 1e9) * 1e6


def rows_of(table: dict) -> list[dict]:
    """One dict per measured row (collective, gpus per node, nodes, bytes, us, nvls), a list field spread over
    the rows."""
    out = []
    nodes = table.get("nodes", 1)
    for i, (size, value) in enumerate(table["rows"]):
        coll = table["collective"][i] if isinstance(table["collective"], list) else table["collective"]
        n = table["gpus"][i] if isinstance(table["gpus"], list) else table["gpus"]
        nvls = bool(table.get("nvls")) and size >= table.get("nvls_from_bytes", 0) and coll == "allreduce"
        out.append({"collective": coll, "gpus": n, "nodes": nodes, "bytes": size, "nvls": nvls,
                    "measured_us": measured_us(table["unit"], coll, n * nodes, size, value)})
    return out


def price_us(gpu: str, row: dict, params: CostParams, inter_bw_gbps: float | None = None) -> float:
    """What the cost model charges ``row``'s collective over ``row['gpus']`` GPUs on each of ``row['nodes']``
    catalogue nodes of ``gpu`` (its node class's network, or ``inter_bw_gbps`` GB/s per node where the source
    states its own), the group's share of each node's network its own."""
    n, k = row["gpus"], row["nodes"]
    cluster = load_cluster(f"{k}x{n}x{gpu}")
    if inter_bw_gbps is not None:
        cluster = dataclasses.replace(cluster, inter_bw_gbps=float(inter_bw_gbps))
    stage = StageContext(cluster, tuple(range(n * k)), 1, 1, params)  # the whole group
    return float(stage.collectives.time(row["collective"], row["bytes"], stage.stage_links)) * 1e6


def _mape(rows: list[dict], key: str) -> float | None:
    errs = [abs(r[key] / r["measured_us"] - 1.0) for r in rows]
    return 100.0 * sum(errs) / len(errs) if errs else None


def score(table: dict) -> dict:
    """The table's rows priced both ways, with MAPE per payload band (NVLS rows apart)."""
    line = CostParams(link_efficiency=1.0)
    rows = rows_of(table)
    net = table.get("inter_bw_gbps")
    for r in rows:
        r["predicted_us"] = price_us(table["gpu"], r, CostParams(), net)
        r["line_rate_us"] = price_us(table["gpu"], r, line, net)
    out = {"id": table["id"], "gpu": table["gpu"], "section": table["section"], "algo": table["algo"], "rows": rows,
           "bands": {}}
    for name, lo, hi in BANDS:
        sel = [r for r in rows if lo <= r["bytes"] < hi and not r["nvls"]]
        if sel:
            out["bands"][name] = {"rows": len(sel), "mape_pct": _mape(sel, "predicted_us"),
                                  "line_rate_mape_pct": _mape(sel, "line_rate_us")}
    nv = [r for r in rows if r["nvls"]]
    if nv:
        out["bands"]["NVLS (not modelled)"] = {"rows": len(nv), "mape_pct": _mape(nv, "predicted_us"),
                                               "line_rate_mape_pct": _mape(nv, "line_rate_us")}
    return out


def table_text(results: list[dict]) -> str:
    lines = [f"{'table':28s} {'gpu':8s} {'band':20s} {'rows':>4s} {'MAPE':>7s} {'line-rate MAPE':>15s}"]
    for t in results:
        for band, b in t["bands"].items():
            lines.append(f"{t['id']:28s} {t['gpu']:8s} {band:20s} {b['rows']:4d} {b['mape_pct']:6.1f}% "
                         f"{b['line_rate_mape_pct']:14.1f}%")
    return "\n".join(lines)


def rows_text(t: dict) -> str:
    lines = [f"{t['id']} ({t['gpu']}, {t['algo']}):"]
    for r in t["rows"]:
        lines.append(f"  {r['collective']:14s} {r['nodes']}x{r['gpus']} GPUs {r['bytes'] / MIB:12.3f} MiB  measured "
                     f"{r['measured_us']:10.1f} us  model {r['predicted_us']:10.1f} "
                     f"({r['predicted_us'] / r['measured_us']:4.2f})  line rate {r['line_rate_us']:10.1f} "
                     f"({r['line_rate_us'] / r['measured_us']:4.2f}){'  NVLS' if r['nvls'] else ''}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(HERE / "results" / "collective_fidelity.json"))
    args = ap.parse_args()
    results, sources = [], []
    for path in sorted(DATA.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        sources.append({"file": str(path.relative_to(HERE.parent)), "source": doc["source"]})
        results += [score(t) for t in doc["tables"]]
    for t in results:
        print(rows_text(t))
    print()
    print(table_text(results))
    out = {"what": __doc__.splitlines()[0], "cost_params": "defaults (and link_efficiency 1: the line rate)",
           "sources": sources, "tables": results}
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
