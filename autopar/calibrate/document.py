"""The calibration file (``autopar-calibration/1``) and its printed summary.

The document holds what ``--profile`` needs (``format``, ``gpus``, ``cost_params``: the fitted fields
only; read back by ``autopar.profile.load_profile``) and how it came to be: the base parameters (the
defaults the fitted fields started from; each run is estimated with its own plan's, at its precision), every run used (measured, default, fitted and held-out seconds) and every case
left out with its reason, the fit's cost, and its error in sample, held out (cross-validation) and
with the base parameters, so a reader can judge it without running anything.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict

from autopar.calibrate.fit import Fit
from autopar.calibrate.inputs import Inputs
from autopar.calibrate.score import CrossValidation
from autopar.calibrate.table import Fittable, scalar_fields
from autopar.profile.io import CALIBRATION_FORMAT
from autopar.version import __version__
from cost_models import CostParams


def calibration_doc(inputs: Inputs, rows: list[Fittable], base: CostParams, default_s: list[float], done: Fit,
                    cv: CrossValidation, figures: dict) -> dict:
    """The calibration document; ``figures``: ``{default, in_sample, cv}`` scores (``score.scores``)."""
    base_d = asdict(base)
    return {
        "format": CALIBRATION_FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "autopar": __version__,
        "gpus": inputs.gpus,
        "fitted": [r.name for r in rows],
        "cost_params": dict(done.values),
        "base_params": {k: base_d[k] for k in sorted(scalar_fields())},
        "bounds": {r.name: {"low": r.low, "high": r.high, "log": r.log} for r in rows},
        "figures": figures,
        "cv": {"method": "leave-one-out" if len(cv.folds) == len(inputs.runs) else f"{len(cv.folds)}-fold",
               "folds": cv.folds, "notes": cv.notes},
        "fit": {"seconds": round(done.seconds, 3), "evaluations": done.nfev, "message": done.message,
                "loss": "soft_l1 on log(predicted / measured)"},
        "runs": {
            "used": [{"id": r.case_id, "source": r.source, "group": r.group, "measured_s": r.measured_s,
                      "default_s": d, "fitted_s": f, "held_out_s": h}
                     for r, d, f, h in zip(inputs.runs, default_s, done.predicted_s, cv.predicted_s)],
            "skipped": inputs.skipped,
        },
    }


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary(doc: dict) -> str:
    """What ``autopar calibrate`` prints: the fitted fields, then the errors with and without them."""
    runs = doc["runs"]
    skipped = ", ".join(f"{s['id']} ({s['reason']})" for s in runs["skipped"][:8])
    more = f" and {len(runs['skipped']) - 8} more" if len(runs["skipped"]) > 8 else ""
    lines = [f"calibrated on {len(runs['used'])} run(s) of {', '.join(doc['gpus'])}; skipped "
             f"{len(runs['skipped'])}{': ' + skipped + more if skipped else ''}",
             f"fit: {doc['fit']['seconds']:.2f} s, {doc['fit']['evaluations']} evaluations ({doc['fit']['message']})"]
    for name, value in doc["cost_params"].items():
        lines.append(f"  {name:<24} {value:.6g}  (base {doc['base_params'][name]:.6g})")
    lines.append(f"{'':<28} {'MAPE':>7} {'Spearman':>8} {'regret':>7}")
    for key, label in (("default", "base parameters"), ("in_sample", "fitted, in sample"),
                       ("cv", f"fitted, held out ({doc['cv']['method']})")):
        f = doc["figures"][key]
        lines.append(f"  {label:<26} {_pct(f['mape']):>7} {_num(f['spearman'], '.3f'):>8} {_num(f['regret'], '.3f'):>7}")
    lines += [f"note: {n}" for n in doc["cv"]["notes"]]
    return "\n".join(lines)
