"""Async tensor parallelism: sequence parallelism's collectives micro-pipelined with the matmuls they feed.

PyTorch's async TP (torch.compile's ``_micro_pipeline_tp`` pass over symmetric memory; torchtitan's
``enable_async_tensor_parallel``; Megatron's ``--tp-comm-overlap`` is the same idea) splits each
all-gather feeding a column-parallel matmul, and each reduce-scatter fed by a row-parallel one, into tp
steps: while the matmul of one chunk runs, the next chunk travels (copy engine, not SMs). The same
collectives move the same bytes; only when they run changes.

The assumption, per micro-batch and per pass (forward; backward with its recomputation):

* ``core``: the layer's SP collectives as ``cost_models.layer.tp_comm_times`` prices them, less the
  boundary all-gather autopar's runtime adds to keep unit boundaries at full sequence length (that
  one feeds no matmul of the unit: it stays exposed).
* Of ``core``, one step in tp cannot overlap (the first chunk of a gather arrives before any matmul
  can use it; the last partial sum of a reduce-scatter leaves after the last matmul): ``core / tp``
  stays exposed.
* The rest hides behind at most ``overlap`` (``CostParams.async_tp_overlap``) of the time of the
  unit's matmuls (its forward FLOPs less the attention core, at the layer's efficiency; backward runs
  twice those, plus the forward's again where recomputation reruns them). 1 by default (the ideal
  decomposition); measured runs put it below 1 because the chunked matmuls run slower than one large
  matmul (wave quantisation, launch gaps) and compete for memory bandwidth with the transfers:
  ``autopar calibrate`` fits it.
* The decomposition moves the gathered / scattered activations through HBM once more (written to and
  read from the symmetric-memory buffer): ``2 * core bytes / hbm_bw``, always exposed.
* Its chunked matmuls, 1/tp of the rows each, leave more of the SMs idle than one large matmul did
  (``chunked_wave_times``; on a GPU whose SM count is known): always exposed. That share of the write-up's
  slowdown no longer needs ``overlap`` below 1.

The result is never more than plain TP's cost plus that copy: async TP cannot win where the matmuls are
short against the transfer copy (small micro-batches on fast NVLink), which is where the search leaves it off.
"""

from __future__ import annotations

import numpy as np

from cost_models.compute import linear_efficiency
from cost_models.gemm_shapes import fixed_depth, wave_times


def async_tp_exposed(tp_pass: np.ndarray, boundary_pass: np.ndarray, tp: np.ndarray, matmul_pass: np.ndarray,
                     copy_pass: np.ndarray, overlap: float) -> np.ndarray:
    """Seconds of one pass's TP communication an async-TP layer leaves on the critical path, per strategy.

    ``tp_pass``: the pass's TP collectives as plain TP pays them (boundary all-gather included);
    ``boundary_pass``: that boundary all-gather's share; ``matmul_pass``: the pass's matmul seconds;
    ``copy_pass``: the decomposition's extra HBM traffic in seconds; ``overlap``: the fraction of the
    matmul time the transfers can hide behind. Promises: ``boundary + core/tp + copy <= result <=
    tp_pass + copy``, and the result falls as ``overlap`` or the matmul time grows.
    """
    core = np.maximum(0.0, tp_pass - boundary_pass)
    first = core / np.maximum(tp, 1.0)
    hidden = np.minimum(core - first, overlap * np.maximum(matmul_pass, 0.0))
    return boundary_pass + (core - hidden) + copy_pass


def async_tp_times(tp_fwd: np.ndarray, tp_bwd: np.ndarray, boundary_fwd: np.ndarray, bwd_factor: np.ndarray,
                   tp: np.ndarray, matmul_fwd: np.ndarray, core_bytes: np.ndarray, hbm_bw: float,
                   overlap: float) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) exposed TP seconds of async-TP strategies (``async_tp_exposed`` per pass).

    ``bwd_factor``: backward's TP collectives as a multiple of forward's (``layer.TP_BWD_FACTOR``: 1 without
    recomputation, more where it reruns the forward's); backward's matmuls are 2 + (factor - 1) times the
    forward's; ``core_bytes``: the bytes the unit's SP collectives move per forward (per rank's micro-batch).
    """
    copy_fwd = 2.0 * core_bytes / hbm_bw
    fwd = async_tp_exposed(tp_fwd, boundary_fwd, tp, matmul_fwd, copy_fwd, overlap)
    bwd = async_tp_exposed(tp_bwd, boundary_fwd * bwd_factor, tp, matmul_fwd * (1.0 + bwd_factor),
                           copy_fwd * bwd_factor, overlap)
    return fwd, bwd


def async_tp_layer(layer, stage, sel: np.ndarray, tp: np.ndarray, b_local: np.ndarray, tp_fwd: np.ndarray,
                   tp_bwd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``tp_fwd``, ``tp_bwd`` (plain TP's, from ``layer.tp_comm_times``) with the strategies in ``sel``
    (async TP with tp > 1 and sp) priced by ``async_tp_times``; the others unchanged.

    ``layer`` and ``stage`` are ``cost_models.layer``'s ``Layer`` and ``Stage``: the boundary all-gather is
    priced as ``tp_comm_times`` prices it, the matmuls at the efficiency the layer's compute uses.
    """
    fwd, bwd = tp_fwd.copy(), tp_bwd.copy()
    p = stage.params
    for t in np.unique(tp[sel]):
        s = sel & (tp == t)
        boundary = p.tp_boundary_gather * stage.collectives.time("allgather", layer.boundary_bytes * b_local[s],
                                                                 stage.tp_links(int(t)))
        factor = np.where(tp_fwd[s] > 0, tp_bwd[s] / np.where(tp_fwd[s] > 0, tp_fwd[s], 1.0), 1.0)
        eff = float(linear_efficiency(p.efficiency(layer.kind, int(t), 0)[0], stage.matmul_ratios[0], p, layer.kind))
        matmul = max(layer.flops - layer.attn_core_flops, 0.0) * b_local[s] / t / (stage.peak_flops * eff)
        fwd[s], bwd[s] = async_tp_times(tp_fwd[s], tp_bwd[s], boundary, factor, tp[s], matmul,
                                        layer.tp_comm_bytes * b_local[s], stage.hbm_bw, p.async_tp_overlap)
        if not p.has_curve(layer.kind):  # a measured curve times its own matmuls
            chunk_fwd, chunk_bwd = chunked_wave_times(layer, stage.sms, tp[s], b_local[s], stage.peak_flops * eff,
                                                      fixed_depth(stage.peak_flops, stage.sms))
            fwd[s], bwd[s] = fwd[s] + chunk_fwd, bwd[s] + chunk_bwd
    return fwd, bwd


def chunked_wave_times(layer, sms: int, tp: np.ndarray, b_local: np.ndarray,
                       rate: float, fixed: float) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds the decomposition's chunked matmuls add in idle tiles and waves, per strategy.

    Async TP runs each forward and input-gradient matmul of the unit as tp matmuls of 1/tp of its rows (one per
    gathered or scattered chunk; the weight gradient stays one matmul over all rows); each pays its own partial
    waves (``cost_models.gemm_shapes``), the slowdown PyTorch's async-TP write-up names, where one large matmul
    paid one. 0 without the unit's matmul shapes or an SM count, and
    never below 0 (chunks that happen to fill their waves better are not counted as a gain).
    """
    gemms, none = getattr(layer, "gemms", ()), np.zeros_like(tp)
    if sms <= 0 or not gemms:
        return none, none
    whole = wave_times(gemms, layer.gemm_rows, tp, b_local, none, sms, rate, fixed)
    chunk = wave_times(gemms, layer.gemm_rows, tp, b_local / tp, none, sms, rate, fixed, chunked=True)
    return np.maximum(0.0, tp * chunk[0] - whole[0]), np.maximum(0.0, tp * chunk[1] - whole[1])
