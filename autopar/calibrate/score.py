"""How well predictions match measured times, and the fit's held-out error (cross-validation).

``scores`` gives MAPE (a fraction), Spearman's rho within each group of runs doing the same work
(groups of 3+, averaged) and regret (measured time of the run predicted fastest / the measured
fastest, per group of 2+, averaged): a ranking only means something among plans of the same work.

``cross_validate`` holds out every run once: leave-one-out up to ``LOO_MAX`` runs, ``k`` folds beyond
(run i in fold i mod k). Each fold is fitted on the other runs alone, so no run is ever scored by a fit
that saw it; a field the fold's runs cannot identify is not fitted there (the runs' own value), and a
note says so. ``start``: where the fitted fields start (``table.start_u``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from scipy.stats import spearmanr

from autopar.calibrate.fit import fit, jacobian, predict, refusals
from autopar.calibrate.inputs import CalRun
from autopar.calibrate.select import select_rows
from autopar.calibrate.table import Fittable
from autopar.estimate import estimate_plan, plan_cost_params
from cost_models import CostParams

LOO_MAX = 8


def predicted_under(runs: list, change: Callable[[CostParams], CostParams]) -> list[float]:
    """Step seconds of measured runs (anything with a ``plan`` and a ``model``: ``autopar.measured`` runs) estimated
    at their plans' own cost parameters passed through ``change``."""
    return [estimate_plan(r.plan, r.model, change(plan_cost_params(r.plan))).step_time_s for r in runs]


def mape_of_ratios(ratios: list[float]) -> float | None:
    """Mean absolute percentage error (as a fraction) of predicted / measured ratios; None for none."""
    return statistics.fmean(abs(x - 1) for x in ratios) if ratios else None


def scores(groups: list[str], predicted: list[float], measured: list[float]) -> dict:
    """``{mape, spearman, spearman_groups, regret, regret_groups}`` of the runs (None: no group to rank)."""
    ratios = [p / m for p, m in zip(predicted, measured)]
    out: dict = {"runs": len(ratios), "mape": mape_of_ratios(ratios)}
    rhos, regrets = [], []
    for g in dict.fromkeys(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        p, m = [predicted[i] for i in idx], [measured[i] for i in idx]
        if len(idx) >= 3:
            rho = spearmanr(p, m).statistic
            if rho == rho:  # NaN: a constant column
                rhos.append(float(rho))
        if len(idx) >= 2:
            regrets.append(m[min(range(len(idx)), key=p.__getitem__)] / min(m))
    out["spearman"] = statistics.fmean(rhos) if rhos else None
    out["spearman_groups"] = len(rhos)
    out["regret"] = statistics.fmean(regrets) if regrets else None
    out["regret_groups"] = len(regrets)
    return out


def folds(n: int, k: int) -> list[list[int]]:
    """Held-out index sets: one per run up to ``LOO_MAX`` runs, else ``k`` interleaved folds."""
    k = n if n <= LOO_MAX else min(k, n)
    return [list(range(j, n, k)) for j in range(k)]


def identifiable(runs: list[CalRun], rows: list[Fittable], start: CostParams) -> tuple[list[Fittable], list[str]]:
    """The rows ``runs`` can fit, and a line per row they cannot: a row no prediction depends on, and
    the second of a collinear pair (until the rest is of full rank)."""
    jac, keep, notes = jacobian(runs, rows, start), list(range(len(rows))), []
    while keep:
        bad = refusals(jac[:, keep], [rows[j] for j in keep])
        if not bad:
            break
        drop = {e.field.split(",")[-1] for e in bad}
        notes += [str(e) for e in bad]
        keep = [j for j in keep if rows[j].name not in drop]
    return [rows[j] for j in keep], notes


@dataclass
class CrossValidation:
    """Held-out predictions (one per run, in run order), the folds and what a fold could not fit."""

    predicted_s: list[float]
    folds: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def fit_identifiable(runs: list[CalRun], rows: list[Fittable], start: CostParams,
                     auto: bool = False) -> tuple[dict[str, float], list[str]]:
    """The fields of the rows ``runs`` identify, fitted to them; a note per row left out (not fitted).
    ``auto``: only those forward selection keeps (``select.select_rows``: the fields that predict held-out
    runs), with a note naming them and why selection stopped."""
    ok, notes = identifiable(runs, rows, start)
    if ok and auto:
        sel = select_rows(runs, ok, start)
        notes.append(f"selected {', '.join(r.name for r in sel.rows) or 'no field'} of {len(ok)} identifiable "
                     f"(held-out squared log error {' -> '.join(f'{x:.3g}' for x in sel.press)}): {sel.stopped}")
        return sel.values, notes
    return (fit(runs, ok, start).values if ok else {}), notes


def cross_validate(runs: list[CalRun], rows: list[Fittable], start: CostParams, k: int = 5,
                   auto: bool = False) -> CrossValidation:
    """Every run predicted by a fit on the other runs (see the module docstring; ``auto``: each fold selects
    its fields itself, ``fit_identifiable``)."""
    pred = [0.0] * len(runs)
    cv = CrossValidation(pred)
    for j, held in enumerate(folds(len(runs), k)):
        train = [r for i, r in enumerate(runs) if i not in held]
        fitted, notes = fit_identifiable(train, rows, start, auto)
        cv.notes += [f"fold {j + 1}: {n}" for n in notes]
        for i, p in zip(held, predict([runs[i] for i in held], fitted)):
            pred[i] = float(p)
        cv.folds.append({"held_out": [runs[i].case_id for i in held], "fitted": fitted})
    return cv
