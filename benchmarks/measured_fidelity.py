"""Measured fidelity: the cost model's step-time predictions against public measurements, per source.

Reads every ``autopar-measured/1`` file in ``../shared/measured/`` (beside the repository, skipped when
absent) and ``benchmarks/data/`` with ``autopar.measured.load_runs``, estimates every runnable case with
the default cost parameters (``estimate_plan(plan, model)``; no fitting here: calibration comes later, on
held-out splits) and reports per source and per group (cases doing the same work on the same cluster:
model shape and heads, sequence length, global batch, GPUs):

* used / skipped cases (skipped by reason: inexpressible, suspect, unpublished, unknown GPU, refused);
* MAPE of the step time, and the median predicted / measured ratio (< 1: the model is optimistic);
* Spearman of predicted vs measured within a group (groups of 3+ plans; a source's is their mean);
* regret: measured time of the plan the model ranks fastest / the measured fastest, per group (2+ plans;
  a source's is the mean over its groups);
* out of memory: of the ``failed`` cases (did not run), how many the model says do not fit
  (``est.fits`` false), and how many plans that did run it predicts not to fit.

    python benchmarks/measured_fidelity.py        # prints the table, writes results/measured_fidelity.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from scipy.stats import spearmanr

from autopar.estimate import estimate_plan
from autopar.measured import RunSet, load_runs

HERE = Path(__file__).resolve().parent
SHARED = Path(__file__).resolve().parents[2] / "shared" / "measured"
DATA = HERE / "data"


def measured_files() -> list[Path]:
    """The measured files: the shared ones (when present) first, then the repository's own."""
    dirs = [d for d in (SHARED, DATA) if d.is_dir()]
    return [p for d in dirs for p in sorted(d.glob("*.yaml"))]


def _stats(rows: list[dict]) -> dict:
    """MAPE, median ratio, Spearman and regret of ``rows`` (one group, or the pooled rows of a source)."""
    ok = [r for r in rows if r["measured_s"] is not None]
    out: dict = {"used": len(ok)}
    if ok:
        ratios = [r["predicted_s"] / r["measured_s"] for r in ok]
        out["mape_pct"] = 100 * statistics.fmean(abs(x - 1) for x in ratios)
        out["median_ratio"] = statistics.median(ratios)
    if len(ok) >= 3:
        rho = spearmanr([r["predicted_s"] for r in ok], [r["measured_s"] for r in ok]).statistic
        out["spearman"] = None if rho != rho else float(rho)  # NaN: a constant column
    if len(ok) >= 2:
        chosen = min(ok, key=lambda r: r["predicted_s"])
        out["regret"] = chosen["measured_s"] / min(r["measured_s"] for r in ok)
        out["chosen"] = chosen["id"]
    return out


def score(rs: RunSet) -> dict:
    """The figures of one source: per case, per group and for the whole source."""
    cases = []
    for run in rs.runs + rs.failed:
        est = estimate_plan(run.plan, run.model)
        cases.append({"id": run.case_id, "group": run.group, "status": run.status, "measured_s": run.measured_s,
                      "predicted_s": est.step_time_s, "fits": est.fits, "max_memory_gib": est.max_memory_gib,
                      "source_predicted_s": run.source_predicted_s, "notes": run.notes})
    groups = {}
    for g in dict.fromkeys(c["group"] for c in cases):
        rows = [c for c in cases if c["group"] == g]
        groups[g] = {**_stats(rows), "failed": sum(c["status"] == "failed" for c in rows),
                     "failed_said_oom": sum(c["status"] == "failed" and not c["fits"] for c in rows),
                     "ran_said_oom": sum(c["status"] == "ok" and not c["fits"] for c in rows)}
    src = _stats(cases)
    for key in ("spearman", "regret", "chosen"):  # pooled across groups they mean nothing
        src.pop(key, None)
    for key in ("spearman", "regret"):
        vals = [g[key] for g in groups.values() if g.get(key) is not None]
        src[key] = statistics.fmean(vals) if vals else None
        src[f"{key}_groups"] = len(vals)
    for key in ("failed", "failed_said_oom", "ran_said_oom"):
        src[key] = sum(g[key] for g in groups.values())
    return {"name": rs.name, "path": rs.path, "source": rs.source, "cases_in_file": rs.total, **src, "skipped": rs.skip_counts(),
            "skipped_cases": [{"id": s.case_id, "reason": s.reason, "detail": s.detail} for s in rs.skipped],
            "notes": rs.notes, "groups": groups, "cases": cases}


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(results: list[dict]) -> str:
    """The printed table: a line per source, then its groups when it has several."""
    head = (f"{'source / group':<52} {'used':>4} {'skip':>4} {'MAPE%':>6} {'med p/m':>7} {'rho':>5} "
            f"{'regret':>6} {'OOM said/failed':>15} {'ran,said OOM':>12}")
    lines = [head, "-" * len(head)]

    def row(label: str, d: dict, skipped: str) -> str:
        return (f"{label:<52} {d['used']:>4} {skipped:>4} {_fmt(d.get('mape_pct'), '.1f'):>6} "
                f"{_fmt(d.get('median_ratio'), '.2f'):>7} {_fmt(d.get('spearman'), '.2f'):>5} "
                f"{_fmt(d.get('regret'), '.3f'):>6} {str(d['failed_said_oom']) + '/' + str(d['failed']):>15} "
                f"{d['ran_said_oom']:>12}")

    for r in results:
        lines.append(row(r["name"], r, str(sum(r["skipped"].values()))))
        if len(r["groups"]) > 1:
            lines += [row("  " + g, d, "") for g, d in r["groups"].items()]
        if r["skipped"]:
            lines.append("  skipped: " + ", ".join(f"{n} {k}" for k, n in sorted(r["skipped"].items())))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(HERE / "results" / "measured_fidelity.json"))
    args = ap.parse_args()
    results = [score(load_runs(p)) for p in measured_files()]
    for r in results:  # repository-relative: the results file must not name this machine's folders
        r["path"] = os.path.relpath(r["path"], HERE.parent)
    print(table(results))
    out = {"what": __doc__.splitlines()[0], "cost_params": "defaults", "sources": results}
    Path(args.output).write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
