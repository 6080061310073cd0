"""Pipeline partition: which contiguous layers each stage gets, chosen jointly with the strategies.

Given ``C_i[a, b]``, the least per-micro-batch cost ``w + s / m`` of stage i running layers a..b-1
(best per-layer strategies under stage i's memory, from the frontier DP), ``S_i[a, b]`` the step tail
``s`` of those strategies, and ``P_i[b]``, what stage i pays to send its output onward, the step
time of a partition is ``cost_models.pipeline.pipeline_time``:

    T = sum_i (W_i + P_i) + max_i G_i + o (m + p - 1),   W = C - S / m,   G = (m - 1) W + S.

Over partitions we enumerate the bottleneck tau (a value of G) in ascending order: for each tau, a
DP gives the least sum of W + P with every G_i <= tau; the loop stops once tau plus the
unconstrained least sum cannot beat the best found. Exact over partitions of these tables, and
usually a handful of iterations. The closed form is not the simulated schedule that prices plans
(``cost_models.pipeline``): the search re-prices the best partition and runners-up the loop solved
(``PartitionResult.candidates``) by simulation and keeps the fastest. (Each range's strategies are the frontier's least ``C = (W m + S) / m``:
exactly what T asks of the bottleneck stage, and of every stage when the stages are equal.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cost_models.pipeline import pipeline_time, stage_work

INF = float("inf")


@dataclass
class PartitionResult:
    step_time: float
    bounds: list[int]  # stage i runs layers bounds[i] .. bounds[i+1]-1
    bottleneck: float
    iterations: int
    # Every partition the bottleneck loop solved (the best included), in the order found: the closed form
    # ranks them, the caller may re-price them by simulating their schedules (``candidates``).
    tried: list[list[int]] = field(default_factory=list)

    def candidates(self, most: int) -> list[list[int]]:
        """The best partition first, then up to ``most`` - 1 others the loop solved (latest first)."""
        others = [b for b in reversed(self.tried) if b != self.bounds]
        return [self.bounds] + others[:most - 1]


def _min_sum(W: list[np.ndarray], G: list[np.ndarray], P: list[np.ndarray], tau: float) -> tuple[float, list[int]]:
    """Least sum_i (W_i + P_i) over partitions with every G_i <= tau; (inf, []) when none."""
    L = W[0].shape[0] - 1
    F = np.full(L + 1, INF)
    F[0] = 0.0
    back = []
    for Wi, Gi, Pi in zip(W, G, P):
        cost = np.where(Gi <= tau, Wi + Pi[None, :], INF)
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


def _step_time(C: list[np.ndarray], S: list[np.ndarray], P: list[np.ndarray], bounds: list[int], m: int,
               slot_s: float) -> tuple[float, float]:
    """(T, bottleneck) of one partition: ``pipeline_time``, the very formula ``estimate_plan`` uses."""
    costs = [float(Ci[bounds[i], bounds[i + 1]]) for i, Ci in enumerate(C)]
    steps = [float(Si[bounds[i], bounds[i + 1]]) for i, Si in enumerate(S)]
    sends = [float(Pi[bounds[i + 1]]) for i, Pi in enumerate(P)]
    worst = max((m - 1) * stage_work(c, s, m) + s for c, s in zip(costs, steps))
    return pipeline_time(costs, sends, m, slot_s, steps=steps), worst


def best_partition(C: list[np.ndarray], P: list[np.ndarray], m: int, slot_s: float = 0.0,
                   S: list[np.ndarray] | None = None) -> PartitionResult | None:
    """Exact minimiser of T over partitions into len(C) non-empty stages; None if none fits.

    ``S``: the step tails of ``C``'s ranges (none: 0, every stage's cost all per micro-batch).
    ``slot_s``: ``CostParams.slot_overhead_s``, a constant per (stages, m), so only T carries it.
    """
    if S is None:
        S = [np.zeros_like(Ci) for Ci in C]
    S = [np.where(np.isfinite(Ci), Si, 0.0) for Ci, Si in zip(C, S)]
    W = [stage_work(Ci, Si, m) for Ci, Si in zip(C, S)]
    with np.errstate(invalid="ignore"):  # 0 * inf at m = 1 where nothing fits
        G = [np.where(np.isfinite(Wi), (m - 1) * Wi + Si, INF) for Wi, Si in zip(W, S)]
    s_lb, bounds = _min_sum(W, G, P, INF)
    if not bounds:
        return None
    T, worst = _step_time(C, S, P, bounds, m, slot_s)
    best = PartitionResult(T, bounds, worst, 1)
    tried = [bounds]
    taus = np.unique(np.concatenate([g[np.isfinite(g)] for g in G]))
    # Smallest feasible bottleneck by bisection (feasibility is monotone in tau).
    lo, hi = 0, len(taus) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if np.isfinite(_min_sum(W, G, P, taus[mid])[0]):
            hi = mid
        else:
            lo = mid + 1
    iters = 1
    for tau in taus[lo:]:
        if tau + s_lb + slot_s * (m + len(C) - 1) >= best.step_time:
            break
        s, bnds = _min_sum(W, G, P, float(tau))
        iters += 1
        if bnds:
            if bnds not in tried:
                tried.append(bnds)
            T, worst = _step_time(C, S, P, bnds, m, slot_s)
            if T < best.step_time:
                best = PartitionResult(T, bnds, worst, iters)
    best.iterations = iters
    best.tried = tried
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
