"""How well any cost model could rank a set of measured runs: the noise ceiling of Spearman and regret.

A source that measured the same plan more than once (a re-run, the same layout on another day) shows how
far two measurements of one configuration disagree. ``replicate_sd`` pools that spread: the standard
deviation of log step time about each replicate set's mean (n - k degrees of freedom). ``ceiling`` then
asks what a perfect model, one that predicts every run's true time, would score against one noisy
measurement: taking the measured times as the truth, it draws measurements ``truth * exp(N(0, sd))`` and
scores the truth against them with ``score.scores`` (Spearman and regret per group, averaged over groups
as the benchmark averages them). A cost model's Spearman or regret beyond the ceiling is luck; a target
above the ceiling cannot be met reliably on that data.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from autopar.calibrate.score import scores

DRAWS = 2000  # Monte Carlo draws: the ceiling's own spread is well under 0.01 with this many
SEED = 0  # fixed, so that a benchmark's ceiling is the same number every run


def replicate_sd(sets: list[list[float]]) -> float | None:
    """Pooled standard deviation of log time about each set's mean (sets of 2+ measured seconds of one
    configuration); None without a set of two."""
    sets = [s for s in sets if len(s) >= 2]
    if not sets:
        return None
    dof = sum(len(s) - 1 for s in sets)
    ss = 0.0
    for s in sets:
        logs = [math.log(x) for x in s]
        mean = statistics.fmean(logs)
        ss += sum((x - mean) ** 2 for x in logs)
    return math.sqrt(ss / dof)


def ceiling(groups: list[str], measured: list[float], sd: float, draws: int = DRAWS,
            seed: int = SEED) -> dict:
    """Mean Spearman and regret (over ``draws``) of the true times against noisy measurements of them:
    ``{"spearman", "regret"}``, each None where no group has enough runs to score it."""
    rng = np.random.default_rng(seed)
    truth = np.asarray(measured, dtype=float)
    rhos, regrets = [], []
    for _ in range(draws):
        noisy = truth * np.exp(rng.normal(0.0, sd, len(truth)))
        s = scores(groups, list(truth), list(noisy))
        if s["spearman"] is not None:
            rhos.append(s["spearman"])
        if s["regret"] is not None:
            regrets.append(s["regret"])
    return {"spearman": statistics.fmean(rhos) if rhos else None,
            "regret": statistics.fmean(regrets) if regrets else None}
