"""Compute time: FLOPs at the achieved fraction of peak, plus a fixed per-call overhead; memory-bound kernels
at HBM speed."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from cost_models.params import CostParams


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


def activation_traffic_times(saved_none: np.ndarray, saved_kept: np.ndarray, ckpt: np.ndarray, b_local: np.ndarray,
                             hbm_bw: float, p: CostParams) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of a layer's memory-bound kernels for one micro-batch, per strategy.

    ``saved_none``: activation bytes per sample the layer saves without checkpointing (per rank, after
    its TP/SP split), ``saved_kept``: what it keeps under its own checkpoint mode (``ckpt``: the codes of
    ``cost_models.layer.CKPT_CODE``, 0 for none). The traffic is
    ``act_traffic`` times the saved bytes, a third in forward and two thirds in backward; backward
    also reruns the forward traffic of what checkpointing dropped (all of it under full recompute,
    the attention core under selective, what the op policy does not save under op).
    """
    unit = p.act_traffic * saved_none * b_local / hbm_bw
    fwd = unit / 3.0
    dropped = np.where(ckpt == 0, 0.0, np.maximum(0.0, 1.0 - saved_kept / np.maximum(saved_none, 1e-30)))
    return fwd, 2.0 * fwd + dropped * fwd
