"""The fit: cost parameters that make ``estimate_plan`` match measured step times.

Residuals are ``log(predicted / measured)`` per run (step time for the table's time rows; peak memory
per GPU, for the memory rows, over the runs that publish one), each run estimated with its own cost parameters
(``CalRun.base``) with the fitted fields (``CostParams.with_fitted``: replaced, or scaled where a framework states
its own act_traffic); ``scipy.optimize.least_squares`` minimises them
with a robust loss (soft_l1: one odd run does not pull the fit) over the chosen table rows, in their
fit coordinates (log space for scales) within their bounds, from their start points. Every evaluation
shares one ``CostCache`` across the runs (equal layers under equal strategies are priced once).

Before fitting, ``refusals`` looks at the Jacobian of the residuals at the start point: a field no
run's prediction depends on, or two fields the runs cannot tell apart (a rank deficit of the column
-normalised Jacobian), cannot be fitted from these runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from autopar.calibrate.inputs import CalRun
from autopar.calibrate.table import Fittable, start_u, values
from autopar.errors import AutoparError
from autopar.estimate import CostCache, estimate_plan
from cost_models import CostParams

MAX_NFEV = 60  # evaluations of all runs per fit: a fit of ~100 runs stays within seconds
ZERO = 1e-6  # a Jacobian column (d log predicted / d coordinate) below this everywhere: no information
RANK_TOL = 1e-3  # singular value / largest of the column-normalised Jacobian below this: collinear
STEP = 1e-3  # finite-difference step of the identifiability Jacobian, in fit coordinates (scaled by the range)


def evaluate(runs: list[CalRun], fitted: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """(predicted step seconds, predicted peak GiB per GPU) of ``runs``, each with its own cost parameters
    and the ``fitted`` fields (``{}``: the run's own alone); one CostCache shared by the runs."""
    cache = CostCache()
    ests = [estimate_plan(r.plan, r.model, r.base.with_fitted(fitted), cache) for r in runs]
    return np.array([e.step_time_s for e in ests]), np.array([e.max_memory_gib for e in ests])


def predict(runs: list[CalRun], fitted: dict[str, float]) -> np.ndarray:
    """Predicted step seconds of ``runs`` (``evaluate``)."""
    return evaluate(runs, fitted)[0]


def residuals(runs: list[CalRun], rows: list[Fittable], u) -> np.ndarray:
    """The time residuals (if a time row is fitted), then the memory residuals of the runs that publish
    a peak (if a memory row is)."""
    t, mem = evaluate(runs, values(rows, u))
    parts = []
    if any(row.target == "time" for row in rows):
        parts.append(np.log(t / np.array([r.measured_s for r in runs])))
    if any(row.target == "memory" for row in rows):
        idx = [i for i, r in enumerate(runs) if r.measured_memory_gib]
        parts.append(np.log(mem[idx] / np.array([runs[i].measured_memory_gib for i in idx])))
    return np.concatenate(parts) if parts else np.zeros(0)


def jacobian(runs: list[CalRun], rows: list[Fittable], start: CostParams) -> np.ndarray:
    """d residual / d fit coordinate at the start point (``start``'s values, or the rows' own starts;
    forward differences, stepping into the bounds)."""
    steps = [STEP * max(1.0, hi - lo) if row.log else STEP * (hi - lo) for row in rows for lo, hi in [row.bounds_u]]
    return jacobian_at(runs, rows, np.array(start_u(rows, start)), steps)[1]


def jacobian_at(runs: list[CalRun], rows: list[Fittable], u0: np.ndarray,
                steps: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(residuals at ``u0``, their forward-difference Jacobian there): column j steps ``steps[j]`` along row j,
    backwards where that would leave the row's bounds."""
    r0 = residuals(runs, rows, u0)
    cols = []
    for j, row in enumerate(rows):
        h = steps[j] if u0[j] + steps[j] <= row.bounds_u[1] else -steps[j]
        u = u0.copy()
        u[j] += h
        cols.append((residuals(runs, rows, u) - r0) / h)
    return r0, np.stack(cols, axis=1)


def refusals(jac: np.ndarray, rows: list[Fittable]) -> list[AutoparError]:
    """Why the fields of ``rows`` cannot be fitted from the runs behind ``jac`` (empty: they can)."""
    out = []
    norms = np.abs(jac).max(axis=0) if len(jac) else np.zeros(len(rows))
    live = [j for j in range(len(rows)) if norms[j] >= ZERO]
    for j in range(len(rows)):
        if j not in live:
            what = "step time" if rows[j].target == "time" else "peak memory (or none publishes one)"
            out.append(AutoparError(rows[j].name, f"changes no run's predicted {what}, so these runs cannot fit it",
                                    f"add {rows[j].identified_by}, or leave it out of --fit"))
    if len(live) < 2:
        return out
    cols = jac[:, live] / np.linalg.norm(jac[:, live], axis=0)
    s = np.linalg.svd(cols, compute_uv=False)
    if len(s) < len(live) or s[-1] < RANK_TOL * s[0]:
        cos = np.abs(cols.T @ cols) - np.eye(len(live))
        a, b = np.unravel_index(np.argmax(cos), cos.shape)
        ra, rb = rows[live[a]], rows[live[b]]
        out.append(AutoparError(f"{ra.name},{rb.name}", f"change the runs' predicted times alike (|cos| "
                                f"{cos[a, b]:.4f}, {len(jac)} run(s)): these runs cannot tell them apart",
                                f"fit one of them, or add {ra.identified_by} / {rb.identified_by}"))
    return out


@dataclass
class Fit:
    """A finished fit: the fitted field values, the in-sample predictions and what it cost (``nfev``:
    distinct evaluations of every run's estimate)."""

    values: dict[str, float]
    predicted_s: list[float]
    nfev: int
    seconds: float
    message: str


def fit(runs: list[CalRun], rows: list[Fittable], start: CostParams, max_nfev: int = MAX_NFEV) -> Fit:
    """Fit ``rows`` to ``runs`` from ``start`` (as ``jacobian``; call ``refusals`` first: this assumes the
    rows are identifiable)."""
    t0 = time.perf_counter()
    memo: dict[tuple, np.ndarray] = {}

    def fun(u: np.ndarray) -> np.ndarray:
        key = tuple(float(x) for x in u)
        if key not in memo:
            memo[key] = residuals(runs, rows, u)
        return memo[key]

    lo, hi = (np.array(b) for b in zip(*(row.bounds_u for row in rows)))
    u0 = np.clip(np.array(start_u(rows, start)), lo, hi)
    res = least_squares(fun, u0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05, max_nfev=max_nfev,
                        x_scale="jac", diff_step=1e-4)
    pred = predict(runs, values(rows, res.x))
    return Fit(values(rows, res.x), [float(p) for p in pred], len(memo), time.perf_counter() - t0, str(res.message))
