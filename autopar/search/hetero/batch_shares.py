"""Batch shares: how many samples of the global batch each pipeline trains on.

A pipeline's share is ``micro_batch_size x num_microbatches`` and every layer's dp must divide its
micro-batch size. With a pipeline's strategies fixed, its time is a closed form of m:

    T(m) = sum_i (FB_i + P_i) + max_i ((m - 1) FB_i + ST_i) + o (m + p - 1)

(FB_i: stage i's per-micro-batch forward + backward, ST_i its step-level tail; ``stage_cost``'s
terms; o: ``CostParams.slot_overhead_s``). ``allocate`` finds integers m_j with sum_j mbs_j m_j = B that minimise max_j T_j(m_j)
exactly: bisection on the bottleneck over the sorted candidate times, each probe a reachable-sum
DP. Faster pipelines thus get larger shares, in proportion to their speed as far as integers allow.
T(m) is the closed form (``cost_models.pipeline.pipeline_time``), not the simulated schedule that
prices plans: the shares it gives are a proposal, which the realiser keeps only when ``estimate_plan``
scores it faster than the shares it started from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.pipeline import pipeline_time


@dataclass
class PipelineRate:
    """What T(m) of one pipeline needs: per-stage FB and ST, the p2p term, and the micro-batch size."""

    micro_batch_size: int
    fb: list[float]
    st: list[float]
    p2p: float  # sum_i 2 * p2p_i (both directions of every boundary, once per step)
    max_m: int  # most micro-batches allowed (memory or options)
    slot_s: float = 0.0  # CostParams.slot_overhead_s

    def time(self, m: int) -> float:
        """T(m): the cost model's pipeline formula with every boundary's round trips summed into P."""
        c = [f + s / m for f, s in zip(self.fb, self.st)]
        return pipeline_time(c, [self.p2p] + [0.0] * (len(c) - 1), m, self.slot_s, steps=self.st)


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
    times = []
    for r, lim in zip(rates, limits):
        m = np.arange(1, lim + 1, dtype=float)
        fb, st = np.asarray(r.fb)[:, None], np.asarray(r.st)[:, None]
        t = fb.sum() + ((m - 1) * fb + st).max(axis=0) + r.p2p + r.slot_s * (m + len(r.fb) - 1)  # = r.time(m), all m
        times.append(np.maximum.accumulate(t))  # T grows with m; the running max guards float noise
    cands = np.unique(np.concatenate(times))
    if _feasible(total, rates, times, cands[-1]) is None:
        return None
    lo, hi = 0, len(cands) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _feasible(total, rates, times, cands[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    return _feasible(total, rates, times, cands[lo])


def _window_or(reach: np.ndarray, step: int, count: int) -> np.ndarray:
    """out[x] = any(reach[x - m * step] for m in 1..count), by prefix sums along each residue class."""
    n = len(reach)
    rows = -(-n // step)
    pre = np.zeros(rows * step, dtype=np.int64)
    pre[:n] = reach
    pre = np.cumsum(pre.reshape(rows, step), axis=0).ravel()  # pre[x] = sum of reach[x], reach[x - step], ...
    x = np.arange(n)
    hi = x - step  # newest term: m = 1
    lo = x - (count + 1) * step  # first term past the window
    upto_hi = np.where(hi >= 0, pre[np.maximum(hi, 0)], 0)
    upto_lo = np.where(lo >= 0, pre[np.maximum(lo, 0)], 0)
    return (upto_hi - upto_lo) > 0


def _feasible(total: int, rates: list[PipelineRate], times: list[np.ndarray], tau: float) -> list[int] | None:
    """Counts m_j with T_j(m_j) <= tau and sum mbs_j m_j = total (largest counts first), or None."""
    reach = np.zeros(total + 1, dtype=bool)
    reach[0] = True
    layers = []
    for r, t in zip(rates, times):
        M = int(np.searchsorted(t, tau, side="right"))  # m = 1..M fit under tau
        if M < 1:
            return None
        layers.append((reach, M))
        reach = _window_or(reach, r.micro_batch_size, M)
    if not reach[total]:
        return None
    out, rem = [], total
    for (prev, M), r in zip(reversed(layers), reversed(rates)):
        for m in range(min(M, rem // r.micro_batch_size), 0, -1):
            if prev[rem - m * r.micro_batch_size]:
                out.append(m)
                rem -= m * r.micro_batch_size
                break
    return out[::-1]
