"""Pipeline partition: which contiguous layers each stage gets, chosen jointly with the strategies.

Given ``C_i[a, b]``, the least per-micro-batch cost of stage i running layers a..b-1 (best per-layer
strategies under stage i's memory, from the frontier DP) and ``P_i[b]``, what stage i pays to send
its output onward, the step time of a partition is

    T = (m - 1) * max_i C_i + sum_i (C_i + P_i).

For a fixed partition each stage's strategies are independent, so its least C_i minimises both
terms at once. Over partitions we enumerate the bottleneck tau in ascending order: for each tau, a
DP gives the least sum with every C_i <= tau; the loop stops once (m - 1) tau plus the
unconstrained least sum cannot beat the best found. Exact, and usually a handful of iterations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.pipeline import pipeline_time

INF = float("inf")


@dataclass
class PartitionResult:
    step_time: float
    bounds: list[int]  # stage i runs layers bounds[i] .. bounds[i+1]-1
    bottleneck: float
    iterations: int


def _min_sum(C: list[np.ndarray], P: list[np.ndarray], tau: float) -> tuple[float, list[int]]:
    """Least sum_i (C_i + P_i) over partitions with every C_i <= tau; (inf, []) when none."""
    L = C[0].shape[0] - 1
    F = np.full(L + 1, INF)
    F[0] = 0.0
    back = []
    for Ci, Pi in zip(C, P):
        cost = np.where(Ci <= tau, Ci + Pi[None, :], INF)
        tot = F[:, None] + cost
        arg = np.argmin(tot, axis=0)
        F = tot[arg, np.arange(L + 1)]
        back.append(arg)
    if not np.isfinite(F[L]):
        return INF, []
    return float(F[L]), _backtrack(back, L)


def _backtrack(back: list[np.ndarray], L: int) -> list[int]:
    """Stage bounds from the per-stage argmin tables of a partition DP ending at layer L."""
    bounds = [L]
    b = L
    for arg in reversed(back):
        b = int(arg[b])
        bounds.append(b)
    return bounds[::-1]


def _step_time(C: list[np.ndarray], P: list[np.ndarray], bounds: list[int], m: int,
               slot_s: float) -> tuple[float, float]:
    """(T, bottleneck) of one partition: ``pipeline_time``, the very formula ``estimate_plan`` uses."""
    costs = [float(Ci[bounds[i], bounds[i + 1]]) for i, Ci in enumerate(C)]
    sends = [float(Pi[bounds[i + 1]]) for i, Pi in enumerate(P)]
    return pipeline_time(costs, sends, m, slot_s), max(costs)


def best_partition(C: list[np.ndarray], P: list[np.ndarray], m: int, slot_s: float = 0.0) -> PartitionResult | None:
    """Exact minimiser of T over partitions into len(C) non-empty stages; None if none fits.

    ``slot_s``: ``CostParams.slot_overhead_s``, a constant per (stages, m), so only T carries it.
    """
    s_lb, bounds = _min_sum(C, P, INF)
    if not bounds:
        return None
    T, worst = _step_time(C, P, bounds, m, slot_s)
    best = PartitionResult(T, bounds, worst, 1)
    if m == 1:
        return best
    taus = np.unique(np.concatenate([c[np.isfinite(c)] for c in C]))
    # Smallest feasible bottleneck by bisection (feasibility is monotone in tau).
    lo, hi = 0, len(taus) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if np.isfinite(_min_sum(C, P, taus[mid])[0]):
            hi = mid
        else:
            lo = mid + 1
    iters = 1
    for tau in taus[lo:]:
        if (m - 1) * tau + s_lb + slot_s * (m + len(C) - 1) >= best.step_time:
            break
        s, bnds = _min_sum(C, P, float(tau))
        iters += 1
        if bnds:
            T, worst = _step_time(C, P, bnds, m, slot_s)
            if T < best.step_time:
                best = PartitionResult(T, bnds, worst, iters)
    best.iterations = iters
    return best


def minmax_partition(M: list[np.ndarray]) -> tuple[float, list[int]]:
    """Partition minimising max_i M_i[a, b] (e.g. the least memory any stage needs)."""
    L = M[0].shape[0] - 1
    G = np.full(L + 1, INF)
    G[0] = -INF
    back = []
    for Mi in M:
        tot = np.maximum(G[:, None], Mi)
        arg = np.argmin(tot, axis=0)
        G = tot[arg, np.arange(L + 1)]
        back.append(arg)
    if not np.isfinite(G[L]):
        return INF, []
    return float(G[L]), _backtrack(back, L)
