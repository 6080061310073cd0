"""Measured fidelity: the cost model's step-time predictions against public measurements, per source.

Reads every ``autopar-measured/1`` file in ``../shared/measured/`` (beside the repository, skipped when
absent) and ``benchmarks/data/`` with ``autopar.measured.load_runs``, estimates every runnable case with
the default cost parameters (``estimate_plan(plan, model)``) and reports per source and per group (cases
doing the same work on the same cluster: model shape and heads, sequence length, global batch, GPUs):

* used / skipped cases (skipped by reason: inexpressible, suspect, unpublished, unknown GPU, refused);
* MAPE of the step time, and the median predicted / measured ratio (< 1: the model is optimistic);
* Spearman of predicted vs measured within a group (groups of 3+ plans; a source's is their mean);
* regret: measured time of the plan the model ranks fastest / the measured fastest, per group (2+ plans;
  a source's is the mean over its groups);
* out of memory: of the ``failed`` cases (did not run), how many the model says do not fit
  (``est.fits`` false), and how many plans that did run it predicts not to fit.

Noise ceiling (``autopar.calibrate.noise``), for a source that measured a configuration more than once
(runs of one group with the same plan whose cases differ only in what the measurement adds: id, date,
section and line, time, published figures): the pooled spread of those re-measurements, and the Spearman
and regret a model predicting every run's true time exactly would score against measurements that noisy.

Calibrated, held out (``autopar.calibrate``, fitting every field of its table, ``FITTABLE``, that the
training runs identify; the others keep their defaults): a group of 4+ runs is fitted on
at most 8 of its runs (9+: 8 spread over the group, the others scored; 4-8: leave-one-out within the
group); a run of a smaller group is scored by a fit on the (at most 8) other runs of its source nearest
to it (same GPUs, then closest device count). No fitted run is ever scored. Per source: calibrated MAPE,
Spearman and regret of the scored runs next to the defaults'; ``targets``: the issue's targets (MAPE <=
0.12, Spearman >= 0.9, regret <= 1.03) over the runs of groups of 4+ (calibrated on their own cluster).
The table's memory rows (``act_mem_factor``, ``reserve_gib``) are fitted in the same fits to the peaks
a source publishes: per source, the held-out peak memory error, and the out-of-memory calls under them
(a scored run under its own fit, a failed run under a fit of its group).

    python benchmarks/measured_fidelity.py        # prints the table, writes results/measured_fidelity.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path

import yaml

from autopar.calibrate import FITTABLE, CalRun, fit_identifiable, scores
from autopar.calibrate.fit import evaluate
from autopar.calibrate.noise import ceiling, replicate_sd
from autopar.calibrate.score import mape_of_ratios
from autopar.estimate import estimate_plan, plan_cost_params
from autopar.measured import RunSet, load_runs
from cost_models import CostParams

HERE = Path(__file__).resolve().parent
SHARED = Path(__file__).resolve().parents[2] / "shared" / "measured"
DATA = HERE / "data"
CAL_MAX, CAL_GROUP = 8, 4  # fit on at most 8 runs; groups of 4+ are calibrated on their own runs
TARGETS = {"mape": 0.12, "spearman": 0.9, "regret": 1.03}
# what one measurement of a configuration adds to its case: cases equal apart from these measured one configuration
MEASUREMENT_KEYS = {"id", "date", "section", "source_line", "measured_s", "published", "status"}


def measured_files() -> list[Path]:
    """The measured files: the shared ones (when present) first, then the repository's own."""
    dirs = [d for d in (SHARED, DATA) if d.is_dir()]
    return [p for d in dirs for p in sorted(d.glob("*.yaml"))]


def _stats(rows: list[dict]) -> dict:
    """MAPE, median ratio, Spearman and regret of ``rows`` (one group, or the pooled rows of a source):
    ``autopar.calibrate.scores``, which ranks within each group, plus the plan the model ranks first."""
    ok = [r for r in rows if r["measured_s"] is not None]
    out: dict = {"used": len(ok)}
    if not ok:
        return out
    s = scores([r["group"] for r in ok], [r["predicted_s"] for r in ok], [r["measured_s"] for r in ok])
    out["mape_pct"] = 100 * s["mape"]
    out["median_ratio"] = statistics.median(r["predicted_s"] / r["measured_s"] for r in ok)
    for key in ("spearman", "regret"):
        if s[key] is not None:
            out[key] = s[key]
        out[f"{key}_groups"] = s[f"{key}_groups"]
    if len(ok) >= 2:
        out["chosen"] = min(ok, key=lambda r: r["predicted_s"])["id"]
    return out


def _nearest(runs: list[CalRun], i: int) -> list[CalRun]:
    """The (at most ``CAL_MAX``) runs of the source nearest run ``i``: same GPUs, then closest device count."""
    def world(r: CalRun) -> int:
        return r.plan.world_size

    others = [j for j in range(len(runs)) if j != i]
    others.sort(key=lambda j: (runs[j].gpus != runs[i].gpus, abs(math.log(world(runs[j]) / world(runs[i]))),
                               abs(j - i)))
    return [runs[j] for j in others[:CAL_MAX]]


def calibrated(rs: RunSet, select: bool = False) -> dict[str, dict]:
    """Per scored run: its held-out calibrated prediction and how it was fitted (see the module docstring;
    ``select``: only the fields forward selection keeps, ``autopar calibrate --fit auto``)."""
    runs = [CalRun(r.case_id, r.plan, r.model, float(r.measured_s), r.group, rs.name, plan_cost_params(r.plan),
                   r.measured_memory_gib) for r in rs.runs]
    rows, start, out = list(FITTABLE), CostParams(), {}

    def score_with(train: list[CalRun], test: list[CalRun], how: str) -> None:
        fitted, notes = fit_identifiable(train, rows, start, auto=select)
        for run, p, mem in zip(test, *evaluate(test, fitted)):
            out[run.case_id] = {"predicted_s": float(p), "memory_gib": float(mem), "how": how,
                                "trained_on": len(train), "fitted": fitted, "notes": notes}

    small = []
    for g in dict.fromkeys(r.group for r in runs):
        members = [r for r in runs if r.group == g]
        if len(members) < CAL_GROUP:
            small += members
        elif len(members) > CAL_MAX:
            train = [members[round(k * (len(members) - 1) / (CAL_MAX - 1))] for k in range(CAL_MAX)]
            score_with(train, [r for r in members if r not in train], "group, 8 fitted")
        elif len(members) >= CAL_GROUP:
            for r in members:
                score_with([m for m in members if m is not r], [r], "group, leave-one-out")
    for r in small:  # a group of 4+'s fitted runs are never scored, not even by another fit
        if len(runs) > 1:
            score_with(_nearest(runs, runs.index(r)), [r], "source, leave-one-out")
    return out


def _cal_stats(cases: list[dict], only_groups: bool = False) -> dict:
    """Calibrated (held out) and default figures over the scored cases (``only_groups``: of groups of 4+)."""
    rows = [c for c in cases if c.get("calibrated_s") is not None
            and (not only_groups or c["calibrated_how"].startswith("group"))]
    groups, measured = [c["group"] for c in rows], [c["measured_s"] for c in rows]
    cal = scores(groups, [c["calibrated_s"] for c in rows], measured)
    default = scores(groups, [c["predicted_s"] for c in rows], measured)
    out = {"scored": len(rows), **{k: cal[k] for k in ("mape", "spearman", "regret")},
           **{f"default_{k}": default[k] for k in ("mape", "spearman", "regret")}}
    if only_groups:
        out["met"] = {k: out[k] is not None and (out[k] >= v if k == "spearman" else out[k] <= v)
                      for k, v in TARGETS.items()}
    return out


def score(rs: RunSet, select: bool = False) -> dict:
    """The figures of one source: per case, per group and for the whole source."""
    cases = []
    cal = calibrated(rs, select)
    by_group = {}  # a failed run is judged under a fit of its group's runs (none of them is itself)
    for cid, held in cal.items():
        by_group.setdefault(next(r.group for r in rs.runs if r.case_id == cid), held["fitted"])
    for run in rs.runs + rs.failed:
        est = estimate_plan(run.plan, run.model)
        held = cal.get(run.case_id, {})
        fitted = held.get("fitted", by_group.get(run.group))
        cal_fits = None
        if fitted is not None and any(k in fitted for k in ("act_mem_factor", "reserve_gib")):
            cal_fits = estimate_plan(run.plan, run.model, plan_cost_params(run.plan).with_fitted(fitted)).fits
        cases.append({"id": run.case_id, "group": run.group, "status": run.status, "measured_s": run.measured_s,
                      "predicted_s": est.step_time_s, "fits": est.fits, "max_memory_gib": est.max_memory_gib,
                      "measured_memory_gib": run.measured_memory_gib,
                      "source_predicted_s": run.source_predicted_s, "calibrated_s": held.get("predicted_s"),
                      "calibrated_memory_gib": held.get("memory_gib"), "calibrated_fits": cal_fits,
                      "calibrated_how": held.get("how"), "calibrated_fit": held.get("fitted"),
                      "calibrated_notes": held.get("notes"), "notes": run.notes})
    groups = {}
    for g in dict.fromkeys(c["group"] for c in cases):
        rows = [c for c in cases if c["group"] == g]
        groups[g] = {**_stats(rows), "failed": sum(c["status"] == "failed" for c in rows),
                     "failed_said_oom": sum(c["status"] == "failed" and not c["fits"] for c in rows),
                     "ran_said_oom": sum(c["status"] == "ok" and not c["fits"] for c in rows)}
    src = _stats(cases)  # Spearman and regret: means over the source's groups, as scores ranks within groups
    src.pop("chosen", None)  # pooled across groups it means nothing
    for key in ("spearman", "regret"):
        src.setdefault(key, None)
        src.setdefault(f"{key}_groups", 0)
    for key in ("failed", "failed_said_oom", "ran_said_oom"):
        src[key] = sum(g[key] for g in groups.values())
    # out of memory under the calibrated memory rows (held out), where a fit of the group has them
    judged = [c for c in cases if c["calibrated_fits"] is not None]
    src["calibrated_oom"] = {"failed": sum(c["status"] == "failed" for c in judged),
                             "failed_said_oom": sum(c["status"] == "failed" and not c["calibrated_fits"] for c in judged),
                             "ran": sum(c["status"] == "ok" for c in judged),
                             "ran_said_oom": sum(c["status"] == "ok" and not c["calibrated_fits"] for c in judged)}
    src["memory"] = _memory_stats(cases)
    src["noise"] = _noise(rs, cases)
    src["calibrated"] = _cal_stats(cases)
    src["calibrated_groups_of_4"] = _cal_stats(cases, only_groups=True)
    return {"name": rs.name, "path": rs.path, "source": rs.source, "cases_in_file": rs.total, **src, "skipped": rs.skip_counts(),
            "skipped_cases": [{"id": s.case_id, "reason": s.reason, "detail": s.detail} for s in rs.skipped],
            "notes": rs.notes, "groups": groups, "cases": cases}


def replicate_sets(rs: RunSet) -> list[list[float]]:
    """Measured seconds of each configuration ``rs`` measured more than once: runs of one group with equal
    plans whose cases in the file differ only in ``MEASUREMENT_KEYS``."""
    raw = {c["id"]: {k: v for k, v in c.items() if k not in MEASUREMENT_KEYS}
           for c in yaml.safe_load(Path(rs.path).read_text())["cases"]}
    sets: list[list] = []
    for run in rs.runs:
        same = next((s for s in sets if s[0].group == run.group and s[0].plan == run.plan
                     and raw[s[0].case_id] == raw[run.case_id]), None)
        if same is None:
            sets.append([run])
        else:
            same.append(run)
    return [[r.measured_s for r in s] for s in sets if len(s) > 1]


def _noise(rs: RunSet, cases: list[dict]) -> dict | None:
    """The source's replicate spread and the noise ceiling of its Spearman and regret (None: no replicate)."""
    sets = replicate_sets(rs)
    sd = replicate_sd(sets)
    if sd is None:
        return None
    ok = [c for c in cases if c["measured_s"] is not None]
    top = ceiling([c["group"] for c in ok], [c["measured_s"] for c in ok], sd)
    return {"replicate_sets": len(sets), "replicated_runs": sum(map(len, sets)), "sd_log": sd,
            "spearman_ceiling": top["spearman"], "regret_ceiling": top["regret"]}


def _memory_stats(cases: list[dict]) -> dict:
    """Predicted peak memory (the plan's most loaded device) against the published peak, where published."""
    pairs = [(c["max_memory_gib"], c["measured_memory_gib"]) for c in cases if c["measured_memory_gib"]]
    if not pairs:
        return {"n": 0}
    ratios = [p / m for p, m in pairs]
    out = {"n": len(pairs), "mape_pct": 100 * mape_of_ratios(ratios),
           "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios)}
    # held out: act_mem_factor and reserve_gib fitted (with the time rows) on other runs of the group
    cal = [c["calibrated_memory_gib"] / c["measured_memory_gib"] for c in cases
           if c["measured_memory_gib"] and c.get("calibrated_memory_gib") is not None]
    out.update(cal_n=len(cal), cal_mape_pct=100 * mape_of_ratios(cal) if cal else None,
               cal_median_ratio=statistics.median(cal) if cal else None)
    return out


def source_table(results: list[dict], columns: list[tuple[str, int, str, object]], part: str,
                 shown=lambda d: True) -> str:
    """A line per source of ``results`` whose ``part`` (a dict per source) is ``shown``: ``columns`` are
    (heading, width, format, key or function of that dict)."""
    head = f"{'source':<34} " + " ".join(f"{h:>{w}}" for h, w, _, _ in columns)
    lines = [head, "-" * len(head)]
    for r in results:
        d = r[part]
        if shown(d):
            cells = [_fmt(get(d) if callable(get) else d.get(get), spec) for _, _, spec, get in columns]
            lines.append(f"{r['name']:<34} " + " ".join(f"{c:>{w}}" for c, (_, w, _, _) in zip(cells, columns)))
    return "\n".join(lines)


def memory_table(results: list[dict]) -> str:
    """Peak memory, predicted vs published, for the sources that publish it."""
    return source_table(results, [("runs", 4, "d", "n"), ("MAPE%", 6, ".1f", "mape_pct"),
                                  ("med p/m", 7, ".2f", "median_ratio"), ("min", 5, ".2f", "min_ratio"),
                                  ("max", 5, ".2f", "max_ratio"), ("cal scored", 10, "d", "cal_n"),
                                  ("MAPE%", 6, ".1f", "cal_mape_pct"), ("med p/m", 7, ".2f", "cal_median_ratio")],
                        "memory", shown=lambda m: m["n"] > 0)


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


def noise_table(results: list[dict]) -> str:
    """The sources with re-measured configurations: their spread and the model's ranking next to the ceiling."""
    named = [{**r, "noise": {**r["noise"], "spearman": r.get("spearman"), "regret": r.get("regret")}}
             for r in results if r["noise"]]
    return source_table(named, [("sets", 4, "d", "replicate_sets"), ("runs", 4, "d", "replicated_runs"),
                                ("sd%", 5, ".1f", _pct("sd_log")), ("rho", 5, ".2f", "spearman"),
                                ("ceiling", 7, ".2f", "spearman_ceiling"), ("regret", 6, ".3f", "regret"),
                                ("ceiling", 7, ".3f", "regret_ceiling")], "noise")


def _pct(key: str):
    return lambda d: None if d.get(key) is None else 100 * d[key]


def calibrated_table(results: list[dict]) -> str:
    """Defaults vs calibrated (held out) per source, over the runs the calibration scored."""
    return source_table(results, [("scored", 6, "d", "scored"), ("MAPE% def", 9, ".1f", _pct("default_mape")),
                                  ("cal", 6, ".1f", _pct("mape")), ("rho def", 7, ".2f", "default_spearman"),
                                  ("cal", 5, ".2f", "spearman"), ("regret def", 10, ".3f", "default_regret"),
                                  ("cal", 6, ".3f", "regret")], "calibrated")


def targets(results: list[dict]) -> dict:
    """The issue's targets over the runs of groups of 4+ (fitted on at most 8 runs of their own group)."""
    cases = [c for r in results for c in r["cases"]]
    return _cal_stats(cases, only_groups=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(HERE / "results" / "measured_fidelity.json"))
    ap.add_argument("--only", help="only these sources (file stems, comma-separated): a quick look; "
                    "the committed results cover them all")
    ap.add_argument("--select", action="store_true", help="fit only the fields forward selection keeps "
                    "(autopar calibrate --fit auto) instead of every field the training runs identify")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    results = [score(load_runs(p), args.select) for p in measured_files() if only is None or p.stem in only]
    for r in results:  # repository-relative: the results file must not name this machine's folders
        r["path"] = os.path.relpath(r["path"], HERE.parent)
    print(table(results))
    print()
    print("peak memory per GPU, predicted vs published (defaults; calibrated, held out):")
    print(memory_table(results))
    print()
    print("out of memory with the calibrated memory rows (held out): " + "; ".join(
        f"{r['name']}: failed said OOM {o['failed_said_oom']}/{o['failed']}, ran said OOM {o['ran_said_oom']}/{o['ran']}"
        for r in results if (o := r["calibrated_oom"])["failed"] + o["ran"]))
    print()
    print("noise ceiling: re-measured configurations' spread; a model exact on every run's true time, ranked "
          "against measurements that noisy (defaults' rho and regret beside it):")
    print(noise_table(results))
    print()
    print(f"calibrated (fitting what the runs identify of {', '.join(r.name for r in FITTABLE)}), held out:")
    print(calibrated_table(results))
    met = targets(results)
    print(f"targets over groups of {CAL_GROUP}+ ({met['scored']} scored runs): MAPE {_fmt(met['mape'], '.3f')} "
          f"(<= {TARGETS['mape']}), Spearman {_fmt(met['spearman'], '.3f')} (>= {TARGETS['spearman']}), regret "
          f"{_fmt(met['regret'], '.3f')} (<= {TARGETS['regret']}): met {met['met']}")
    out = {"what": __doc__.splitlines()[0], "cost_params": "defaults; calibrated: fitted on other runs (held out)",
           "targets": met, "sources": results}
    Path(args.output).write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
