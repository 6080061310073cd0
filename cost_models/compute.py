"""Compute time: FLOPs at the achieved fraction of peak, plus a fixed per-call overhead."""

from __future__ import annotations

import numpy as np


def compute_time(flops, peak_flops, eff_max: float = 0.6, overhead_s: float = 5e-5):
    """Seconds to run ``flops`` FLOPs of one layer call on a device of ``peak_flops`` FLOP/s.

    t = flops / (peak * eff_max) + overhead_s: large work runs at ``eff_max`` of peak; every call
    also pays a fixed overhead (kernel launches, framework dispatch), which is what makes small
    per-rank work inefficient. A call with no FLOPs costs nothing.
    """
    f = np.asarray(flops, dtype=float)
    return np.where(f > 0, f / (np.asarray(peak_flops, dtype=float) * eff_max) + overhead_s, 0.0)


def achieved_efficiency(flops, peak_flops, eff_max: float = 0.6, overhead_s: float = 5e-5):
    """Fraction of peak one call of ``flops`` FLOPs reaches: eff_max * x / (x + overhead * peak * eff_max)."""
    f = np.asarray(flops, dtype=float)
    return np.where(f > 0, f / (compute_time(f, peak_flops, eff_max, overhead_s) * peak_flops), 0.0)


def memory_bound_time(nbytes, hbm_bytes_per_s):
    """Seconds for a bandwidth-bound kernel moving ``nbytes`` (optimizer step, reductions)."""
    return np.asarray(nbytes, dtype=float) / hbm_bytes_per_s
