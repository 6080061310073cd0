"""Compute time: FLOPs over the achieved fraction of peak."""

from __future__ import annotations

import numpy as np


def achieved_efficiency(flops_per_call, eff_max: float, eff_half_flops: float):
    """Fraction of peak a kernel of ``flops_per_call`` FLOPs reaches: a saturating curve.

    ``eff_max`` for large work, half of it at ``eff_half_flops``; zero work gives zero time anyway.
    """
    x = np.asarray(flops_per_call, dtype=float)
    return eff_max * x / (x + eff_half_flops)


def compute_time(flops, peak_flops, eff_max: float = 0.75, eff_half_flops: float = 2.0e10):
    """Seconds to run ``flops`` FLOPs on a device of ``peak_flops`` FLOP/s (0 FLOPs -> 0 s)."""
    f = np.asarray(flops, dtype=float)
    eff = achieved_efficiency(np.maximum(f, 1.0), eff_max, eff_half_flops)
    return np.where(f > 0, f / (np.asarray(peak_flops, dtype=float) * eff), 0.0)


def memory_bound_time(nbytes, hbm_bytes_per_s):
    """Seconds for a bandwidth-bound kernel moving ``nbytes`` (optimizer step, reductions)."""
    return np.asarray(nbytes, dtype=float) / hbm_bytes_per_s
