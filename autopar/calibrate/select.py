"""Which fields a few runs can fit without over-fitting: forward selection by the held-out error.

Every field a set of runs identifies is not a field they should fit: five fields fitted to eight runs follow
those eight runs' noise. So ``select_rows`` keeps the step-time fields that predict runs they were not fitted
to (the memory fields, fitted to other residuals, are kept as identified).

Each round fits every candidate set (the chosen fields plus one more; ``fit.fit``, nonlinear) and scores it
by its approximate leave-one-out error at the fit: with the residuals ``r`` there and their Jacobian ``J``
in the fitted coordinates, ``H = J pinv(J)`` and the held-out residual of run i is ``r_i / (1 - h_ii)``
(PRESS, Allen 1974; at a least-squares optimum this is the first-order leave-one-out residual). The field
whose set has the lowest PRESS joins if it lowers the current PRESS by more than ``MIN_GAIN`` of it and no
run is all but determined by the fit (``h_ii`` below ``MAX_LEVERAGE``); nothing joins once the held-out error
is down to timing noise (``FLOOR``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.calibrate.fit import fit, jacobian_at, residuals
from autopar.calibrate.inputs import CalRun
from autopar.calibrate.table import Fittable
from cost_models import CostParams

MIN_GAIN = 0.05  # a field must lower the held-out squared error by 5% of its current value
MAX_LEVERAGE = 0.99  # a run with h_ii above this is fitted by the field alone: its PRESS term is not an estimate
FLOOR = 2e-3  # a held-out root-mean-square log error below this (0.2%) is as good as timing noise allows
STEP = 1e-2  # forward step of a column without a start, as a fraction of the row's coordinate range


@dataclass
class Selection:
    """The chosen rows, the PRESS after each round (``press[0]``: no field fitted), why selection stopped,
    and the fitted values of the chosen rows."""

    rows: list[Fittable]
    press: list[float]
    stopped: str
    values: dict[str, float]


def press(r0: np.ndarray, cols: np.ndarray) -> tuple[float, np.ndarray]:
    """(PRESS, least-squares step) of the linear model ``r0 + cols @ du`` (inf where a leverage reaches
    ``MAX_LEVERAGE``)."""
    pinv = np.linalg.pinv(cols)
    step = -pinv @ r0
    return _loo_error(r0 + cols @ step, cols, pinv), step


def _loo_error(resid: np.ndarray, cols: np.ndarray, pinv: np.ndarray) -> float:
    """Sum of the squared leave-one-out residuals ``resid_i / (1 - h_ii)``, ``H = cols pinv`` (inf where a
    leverage reaches ``MAX_LEVERAGE``)."""
    lev = np.einsum("ij,ji->i", cols, pinv)
    if np.any(lev >= MAX_LEVERAGE):
        return float("inf")
    return float(np.sum((resid / (1.0 - lev)) ** 2))


def _fitted_press(runs: list[CalRun], rows: list[Fittable], start: CostParams) -> tuple[float, dict[str, float]]:
    """(PRESS at the fit of ``rows`` to ``runs``, the fitted values)."""
    values = fit(runs, rows, start).values
    u0 = np.array([row.to_u(values[row.name]) for row in rows])
    r0, jac = jacobian_at(runs, rows, u0, [STEP * (hi - lo) for row in rows for lo, hi in [row.bounds_u]])
    return _loo_error(r0, jac, np.linalg.pinv(jac)), values


def select_rows(runs: list[CalRun], rows: list[Fittable], start: CostParams) -> Selection:
    """Forward selection over the time rows of ``rows`` (those ``runs`` identify: ``score.identifiable``)
    from ``start``; the memory rows are fitted with the chosen ones."""
    time_rows = [r for r in rows if r.target == "time"]
    memory_rows = [r for r in rows if r.target != "time"]
    chosen: list[Fittable] = []
    current = float(np.sum(residuals(runs, time_rows[:1], [time_rows[0].to_u(float(getattr(start, time_rows[0].name)))]) ** 2)) \
        if time_rows else 0.0
    history, values = [current], {}
    stopped = "every identifiable field chosen"
    while len(chosen) < len(time_rows):
        if current <= FLOOR ** 2 * len(runs):
            stopped = f"the held-out error is below {FLOOR:.1%} already"
            break
        trials = [(_fitted_press(runs, chosen + [r], start), r) for r in time_rows if r not in chosen]
        (best, best_values), best_row = min(trials, key=lambda t: t[0][0])
        if not np.isfinite(best):
            stopped = "every further field determines some run alone"
            break
        if best > (1.0 - MIN_GAIN) * current:
            stopped = f"{best_row.name} would lower the held-out error by less than {MIN_GAIN:.0%}"
            break
        chosen.append(best_row)
        history.append(best)
        current, values = best, best_values
    if memory_rows:
        values = fit(runs, chosen + memory_rows, start).values
    return Selection(chosen + memory_rows, history, stopped, values)
