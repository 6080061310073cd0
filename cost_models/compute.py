"""Compute time: FLOPs at the achieved fraction of peak, plus a fixed per-call overhead."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def compute_time(flops: ArrayLike, peak_flops: ArrayLike, eff_max: ArrayLike = 0.6,
                 overhead_s: ArrayLike = 5e-5) -> np.ndarray:
    """Seconds to run ``flops`` FLOPs of one layer call on a device of ``peak_flops`` FLOP/s.

    t = flops / (peak * eff_max) + overhead_s: large work runs at ``eff_max`` of peak; every call
    also pays a fixed overhead (kernel launches, framework dispatch), which is what makes small
    per-rank work inefficient. A call with no FLOPs costs nothing.
    """
    f = np.asarray(flops, dtype=float)
    return np.where(f > 0, f / (np.asarray(peak_flops, dtype=float) * eff_max) + overhead_s, 0.0)


def memory_bound_time(nbytes: ArrayLike, hbm_bytes_per_s: float) -> np.ndarray:
    """Seconds for a bandwidth-bound kernel moving ``nbytes`` (optimizer step, reductions)."""
    return np.asarray(nbytes, dtype=float) / hbm_bytes_per_s
