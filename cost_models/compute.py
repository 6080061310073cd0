"""Compute time: FLOPs at the achieved fraction of peak, plus a fixed per-call overhead; memory-bound kernels
at HBM speed."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from cost_models.params import REFERENCE_MAMF, CostParams


def compute_time(flops: ArrayLike, peak_flops: ArrayLike, eff_max: ArrayLike = 0.6,
                 overhead_s: ArrayLike = 5e-5) -> np.ndarray:
    """Seconds to run ``flops`` FLOPs of one layer call on a device of ``peak_flops`` FLOP/s.

    t = flops / (peak * eff_max) + overhead_s: large work runs at ``eff_max`` of peak; every call
    also pays a fixed overhead (kernel launches, framework dispatch), which is what makes small
    per-rank work inefficient. A call with no FLOPs costs nothing.
    """
    f = np.asarray(flops, dtype=float)
    return np.where(f > 0, f / (np.asarray(peak_flops, dtype=float) * eff_max) + overhead_s, 0.0)


def layer_efficiency(eff_max: ArrayLike, matmul_ratio: float) -> np.ndarray:
    """``eff_max`` for a layer whose matmuls run ``matmul_ratio`` times as fast as the device's half-precision
    tensor matmuls (``GPUType.matmul_ratio``): the same ``eff_max`` at ratio 1 and above.

    ``eff_max`` was set on the A100's bf16 layers, whose large matmuls reach ``REFERENCE_MAMF`` of peak: per
    peak FLOP a layer spends 1 / REFERENCE_MAMF on its matmuls and 1 / eff_max - 1 / REFERENCE_MAMF on the rest
    (norms, elementwise kernels, launch gaps between kernels). The rest does not run on the matmul units, so it
    keeps its time when they are slower (plain FP32 on the CUDA cores, about 1/16 of the tensor rate): at ratio
    r < 1 the layer reaches REFERENCE_MAMF / (1 + (REFERENCE_MAMF / eff_max - 1) r) of the column's peak, times
    the column's own ``matmul_factor`` as before. Plain FP32 layers thus run near their matmuls' measured share
    (0.75 of an H100's FP32 peak where bf16 layers reach 0.55 of theirs). Faster matmuls (FP8, r about 1.8) keep
    ``eff_max``: the frameworks fuse FP8's casts into the norms and activations around its matmuls (Transformer
    Engine) or add cast and scaling kernels of their own (torchao), and on the published FP8 runs (NeMo 24.07,
    torchtitan: 22 runs) keeping the rest at bf16 speed scored 18.3% MAPE against 14.7% without.
    """
    if matmul_ratio >= 1.0:
        return np.asarray(eff_max, dtype=float)
    rest = REFERENCE_MAMF / np.asarray(eff_max, dtype=float) - 1.0
    return REFERENCE_MAMF / (1.0 + rest * matmul_ratio)


def linear_efficiency(eff_max: ArrayLike, matmul_ratio: float, p: CostParams, kind: str) -> ArrayLike:
    """The efficiency a layer of ``kind`` runs its linear layers at: ``eff_max`` moved by ``layer_efficiency``
    for ``matmul_ratio``, or ``eff_max`` as it is where ``p`` holds a measured curve of that kind (a measured
    curve is its precision's own)."""
    return eff_max if p.has_curve(kind) else layer_efficiency(eff_max, matmul_ratio)


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
