"""Fits: latency + size x inverse bandwidth, GenModel's extra terms, and the compute curve.

All fits minimise *relative* squared error (a 1 KB message and a 16 MB one count alike) with
non-negative coefficients (a negative latency or bandwidth term means noise, not physics), and report
``rel_rms``: the root mean square of (fit - measured) / measured.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from autopar.plan.cost_params import EFF_HIGH


def weighted_nnls(design: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative x minimising sum(((design @ x) - y) / y)^2; returns (x, rel_rms)."""
    A = np.asarray(design, float)
    y = np.asarray(y, float)
    w = 1.0 / y
    scale = np.maximum(np.abs(A * w[:, None]).max(axis=0), 1e-300)  # column scaling: nnls is not scale-free
    x, _ = nnls(A * w[:, None] / scale, np.ones_like(y))
    x = x / scale
    return x, rel_rms(A @ x, y)


def robust_nnls(design: np.ndarray, y: np.ndarray, cut: float = 0.25) -> tuple[np.ndarray, float, int]:
    """``weighted_nnls``, then once more without the points the first fit misses by more than ``cut``
    (relative) and by more than 3x the median miss: a burst of other work on a shared host slows a
    point or two, and one slow point must not bend the line. Returns (x, rel_rms of the kept points,
    points dropped)."""
    A, y = np.asarray(design, float), np.asarray(y, float)
    x, err = weighted_nnls(A, y)
    miss = np.abs(A @ x - y) / y
    keep = ~((miss > cut) & (miss > 3 * np.median(miss)))
    if keep.all() or keep.sum() < max(3, A.shape[1] + 1):
        return x, err, 0
    x, err = weighted_nnls(A[keep], y[keep])
    return x, err, int((~keep).sum())


def rel_rms(pred, y) -> float:
    pred, y = np.asarray(pred, float), np.asarray(y, float)
    return float(np.sqrt(np.mean(((pred - y) / y) ** 2)))


def fit_alpha_beta(sizes, seconds) -> dict:
    """``t = alpha + beta * bytes`` (alpha s, beta s/byte) with its relative RMS residual."""
    S = np.asarray(sizes, float)
    (alpha, beta), err, dropped = robust_nnls(np.stack([np.ones_like(S), S], axis=1), seconds)
    return {"alpha_s": float(alpha), "beta_s_per_byte": float(beta), "rel_rms": err, "outliers_dropped": dropped}


# Per collective: coefficients of (alpha, beta, gamma, delta, epsilon) at group size n and S bytes, as
# GenModel (arXiv 2409.04202) writes a ring algorithm: latency steps, bytes on the wire, bytes reduced,
# incast (fan-in - 1 senders meeting one receiver, each with S/n bytes) and memory access of the buffer.
# S is the collective's "nbytes" as cost_models.communication counts it: all-reduce / reduce-scatter /
# all-to-all the buffer each rank holds, all-gather the gathered output, p2p the message.
GENMODEL_TERMS = {
    "allreduce": lambda S, n: (2 * (n - 1), 2 * (n - 1) / n * S, (n - 1) / n * S, 0.0 * S, S),
    "allgather": lambda S, n: (n - 1, (n - 1) / n * S, 0.0 * S, 0.0 * S, S),
    "reduce_scatter": lambda S, n: (n - 1, (n - 1) / n * S, (n - 1) / n * S, 0.0 * S, S),
    "alltoall": lambda S, n: (n - 1, (n - 1) / n * S, 0.0 * S, np.maximum(n - 2, 0) / n * S, S),
    "p2p": lambda S, n: (1.0 + 0 * S, S, 0.0 * S, 0.0 * S, 0.0 * S),
}
TERM_NAMES = ("alpha", "beta", "gamma", "delta", "epsilon")
KEEP_IF_BETTER = 0.9  # an extra term stays only if it cuts the relative RMS error by 10% or more


def _identifiable(cols: np.ndarray, keep: list[int]) -> bool:
    return np.linalg.matrix_rank(cols[:, keep] / np.maximum(np.abs(cols[:, keep]).max(axis=0), 1e-300)) == len(keep)


def fit_genmodel(kind: str, points: list[tuple[int, float, float]]) -> dict:
    """Joint fit over group sizes of one collective: (n, bytes, seconds) points.

    First the alpha-beta model of the ring algorithm; then each GenModel extra term (gamma, delta,
    epsilon) that the points can tell apart from the others is tried and kept when it cuts the error
    by at least 10%. Returns the coefficients, which terms were kept, and both residuals.
    """
    n = np.array([p[0] for p in points], float)
    S = np.array([p[1] for p in points], float)
    t = np.array([p[2] for p in points], float)
    cols = np.stack(GENMODEL_TERMS[kind](S, n), axis=1).astype(float)
    keep = [0, 1]
    x, base = weighted_nnls(cols[:, keep], t)
    best, best_x = base, x
    tried = {}
    for j in (2, 3, 4):
        if not np.any(cols[:, j]) or not _identifiable(cols, keep + [j]):
            tried[TERM_NAMES[j]] = "not identifiable from these points"
            continue
        xj, err = weighted_nnls(cols[:, keep + [j]], t)
        tried[TERM_NAMES[j]] = round(err, 4)
        if err <= KEEP_IF_BETTER * best:
            keep, best, best_x = keep + [j], err, xj
    coef = dict.fromkeys(TERM_NAMES, 0.0)
    for j, v in zip(keep, best_x):
        coef[TERM_NAMES[j]] = float(v)
    return {"coefficients": coef, "terms": [TERM_NAMES[j] for j in keep], "rel_rms_alpha_beta": base,
            "rel_rms": best, "tried": tried, "group_sizes": sorted({int(v) for v in n})}


def fit_efficiency(samples: list[dict], peak_flops: float) -> dict | None:
    """eff_max and layer_overhead_s of the cost model's compute time from unit timings.

    The cost model charges one call of a unit ``compute_time(F) = F / (peak eff_max) + overhead`` for
    forward, twice that for backward, plus ``compute_time(R)`` for recomputation (R FLOPs: the whole
    forward under full checkpointing, the attention core under selective). So the measured forward +
    backward of each sample is linear in u = 1 / (peak eff_max) and the overhead v:
        t = u (3 F + R) + v (3 + [R > 0])
    Samples with zero FLOPs are left out (the model charges them nothing). A sample's F is
    ``flops_per_rank`` when given (TP splits the work), and its ``tp_comm_s`` (the communication the
    model charges apart from compute: TP collectives, exposed ZeRO traffic; see charged.py) is taken
    off its time. None if nothing to fit. ``eff_max`` is at most ``EFF_HIGH`` (what a stored profile may
    hold): when the charged communication explains nearly all of a kind's time, the samples say little
    about its compute and the bound is recorded with a note.
    """
    rows, ys = [], []
    for s in samples:
        F = s.get("flops_per_rank", s["flops"])
        if F <= 0:
            continue
        R = s.get("recompute_flops", 0.0)
        t = s["fwd_s"] + s["bwd_s"] - s.get("tp_comm_s", 0.0)
        rows.append([3 * F + R, 3 + (R > 0)])
        ys.append(max(t, 1e-3 * (s["fwd_s"] + s["bwd_s"])))
    if not rows:
        return None
    A, y = np.array(rows), np.array(ys)
    (u, v), err, dropped = robust_nnls(A, y)
    note = ""
    if u <= 0:  # times do not grow with FLOPs (noise, or too little work): throughput only, no overhead
        (u,), err, dropped = robust_nnls(A[:, :1], y)
        v, note = 0.0, "no FLOPs slope in the samples: fitted without the overhead term"
    if u <= 0:
        return None
    eff = float(1.0 / (peak_flops * u))
    if eff > EFF_HIGH:  # the charged communication explains (nearly) all the measured time
        capped = f"capped at {EFF_HIGH:g}x the matmul peak: the communication charged apart explains nearly all the time"
        eff, note = EFF_HIGH, f"{note}; {capped}" if note else capped
    out = {"eff_max": eff, "layer_overhead_s": float(v), "rel_rms": err,
           "samples": len(rows), "outliers_dropped": dropped}
    if note:
        out["note"] = note
    return out
