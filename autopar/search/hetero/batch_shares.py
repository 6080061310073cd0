"""Batch shares: how many samples of the global batch each pipeline trains on.

A pipeline's share is ``micro_batch_size x num_microbatches`` and every layer's dp must divide its
micro-batch size. With a pipeline's strategies fixed, its time is a closed form of m:

    T(m) = (m - 1) * max_i C_i(m) + sum_i (C_i(m) + P_i),   C_i(m) = FB_i + ST_i / m

(FB_i: stage i's per-micro-batch forward + backward, ST_i its step-level tail; ``stage_cost``'s
terms). ``allocate`` finds integers m_j with sum_j mbs_j m_j = B that minimise max_j T_j(m_j)
exactly: bisection on the bottleneck over the sorted candidate times, each probe a reachable-sum
DP. Faster pipelines thus get larger shares, in proportion to their speed as far as integers allow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PipelineRate:
    """What T(m) of one pipeline needs: per-stage FB and ST, the p2p term, and the micro-batch size."""

    micro_batch_size: int
    fb: list[float]
    st: list[float]
    p2p: float  # sum_i 2 * p2p_i (both directions of every boundary, once per step)
    max_m: int  # most micro-batches allowed (memory or options)

    def time(self, m: int) -> float:
        c = [f + s / m for f, s in zip(self.fb, self.st)]
        return (m - 1) * max(c) + sum(c) + self.p2p

    def per_sample(self) -> float:
        """Steady-state seconds per sample (the bottleneck stage's cost per micro-batch / mbs)."""
        return max(self.fb) / self.micro_batch_size


def proportional(total: int, weights: list[float], granule: list[int]) -> list[int]:
    """Integer shares near ``total * w / sum(w)``, each a positive multiple of its granule, summing to total.

    Returns [] when no such split exists (e.g. total smaller than the granules).
    """
    n = len(weights)
    if sum(granule) > total:
        return []
    W = sum(weights)
    raw = [total * w / W for w in weights]
    shares = [max(g, int(r // g) * g) for r, g in zip(raw, granule)]
    # Fix the sum: add to the most under-served, or take from the most over-served, a granule at a time.
    for _ in range(4 * total):
        diff = total - sum(shares)
        if diff == 0:
            return shares
        if diff > 0:
            cand = [j for j in range(n) if granule[j] <= diff]
            if not cand:
                break
            j = max(cand, key=lambda j: (raw[j] - shares[j], -j))
            shares[j] += granule[j]
        else:
            cand = [j for j in range(n) if shares[j] > granule[j]]
            if not cand:
                break
            j = max(cand, key=lambda j: (shares[j] - raw[j], -j))
            shares[j] -= granule[j]
    return shares if sum(shares) == total else []


def allocate(total: int, rates: list[PipelineRate]) -> list[int] | None:
    """Micro-batch counts m_j with sum_j mbs_j * m_j = total minimising max_j T_j(m_j); None if impossible."""
    limits = [min(r.max_m, total // r.micro_batch_size) for r in rates]
    if any(lim < 1 for lim in limits):
        return None
    times = [np.array([r.time(m) for m in range(1, lim + 1)]) for r, lim in zip(rates, limits)]
    # T(m) grows with m, but guard against float noise: use the running max as the time of "up to m".
    times = [np.maximum.accumulate(t) for t in times]
    cands = np.unique(np.concatenate(times))
    lo, hi = 0, len(cands) - 1
    if _feasible(total, rates, times, cands[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _feasible(total, rates, times, cands[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    return _feasible(total, rates, times, cands[lo])


def _feasible(total: int, rates: list[PipelineRate], times: list[np.ndarray], tau: float) -> list[int] | None:
    """Counts m_j with T_j(m_j) <= tau and sum mbs_j m_j = total (largest shares to the fastest), or None."""
    reach = np.zeros(total + 1, dtype=bool)
    reach[0] = True
    layers = []
    for r, t in zip(rates, times):
        M = int(np.searchsorted(t, tau, side="right"))  # m = 1..M fit under tau
        if M < 1:
            return None
        nxt = np.zeros(total + 1, dtype=bool)
        for m in range(1, M + 1):
            s = m * r.micro_batch_size
            if s > total:
                break
            nxt[s:] |= reach[:total + 1 - s]
        layers.append((reach, M))
        reach = nxt
    if not reach[total]:
        return None
    out, rem = [], total
    for (prev, M), r in zip(reversed(layers), reversed(rates)):
        for m in range(M, 0, -1):
            s = m * r.micro_batch_size
            if s <= rem and prev[rem - s]:
                out.append(m)
                rem -= s
                break
    return out[::-1]
