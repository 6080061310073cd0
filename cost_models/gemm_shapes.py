"""How much of a GEMM's time is spent on work: tiles of the output scheduled in waves over the SMs.

A GPU runs a matmul by cutting its output into tiles, one thread block each, and running the blocks
in waves of one per streaming multiprocessor (NVIDIA, "Matrix Multiplication Background User's Guide",
DU-09799-001, 2023: sec. 2.3 "Typical tile dimensions in cuBLAS", sec. 3.1 "Tile quantization", sec. 3.2
"Wave quantization"). A partial last tile costs a whole tile and a partial last wave a whole wave, so a
matmul whose output is a few tiles, or a few tiles more than a whole number of waves, runs below the
efficiency of a large one. That is what makes narrow tensor-parallel shards and small micro-batches slower
per FLOP: a GPT-2-medium block at TP 4 with one 1024-token sample per micro-batch on a 40-SM T4 keeps
about three quarters of the SM-time busy, at TP 1 with 8 samples nearly all of it.

A tile's reduction also pays a fixed cost beside its main loop (filling the operand pipeline, the epilogue
that writes the tile), so a shallow reduction (a narrow row-parallel shard's ``k / tp``, a weight gradient
over few tokens) runs below the rate of a deep one: ``depth_utilisation``.

The model: 128 x 128 output tiles (the guide's middle tile, which cuBLAS uses for most large training
GEMMs); when the tiles of a matmul fill less than one wave, the reduction is split (cuBLAS's split-K)
into at most as many parts as whole copies of the tiles fit on the SMs, each part at least ``SPLIT_K_MIN``
deep: the split that runs fastest, since each part's shallower reduction pays its own fixed cost.
Each of a layer's matmuls runs three times per training micro-batch with the same FLOPs: forward
(output tokens x n, reduced over k), input gradient (tokens x k, over n) and weight gradient (k x n, over
tokens). ``layer.compute_times`` divides the GEMM part of a layer's FLOPs by the utilisation here;
``eff_max`` remains the efficiency of large work, which this does not change (1.0 for large GEMMs).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from cost_models.params import REFERENCE_MAMF

TILE = 128  # output tile edge (rows and columns), the guide's 128 x 128
SPLIT_K_MIN = 256  # reduction depth each split-K part keeps at least (two 128-deep main-loop stages)
# A reduction of depth d runs at d / (d + DEPTH_FIXED) of the rate it reaches from DEPTH_FULL on. Fitted
# (least squares) to bf16 products of 8192 x 8192 outputs reduced over 128 .. 16384 on an H200
# (benchmarks/gpu_single_device.py, part depth, back to back between CUDA events; results in
# benchmarks/results/gpu_single_device.json): measured 0.46 / 0.61 / 0.76 / 0.84 / 0.94 / 0.99 of the plateau at
# 128 / 256 / 512 / 768 / 1024 / 1536, this model 0.42 / 0.61 / 0.78 / 0.87 / 0.92 / 0.97, 1.0 from 2048.
# The fixed part is time (filling the pipeline, writing the tile), so in reduction depth it scales with how
# fast an SM runs the main loop: ``fixed_depth`` (an FP32 matmul on the CUDA cores, ~1/15 of the tensor
# rate, pays ~1/15 of the depth; an FP8 one twice a bf16 one's).
DEPTH_FIXED = 210
DEPTH_FULL = 2048
# the H200's bf16 GEMM rate per SM, as GPUType.sustained_flops gives it: the catalogue's 989 TFLOPS x its mamf
# 0.803 over REFERENCE_MAMF, over its 132 SMs (tests/cost_models/test_gemm_shapes.py checks it against the catalogue)
REF_FLOPS_PER_SM = 989e12 * 0.803 / REFERENCE_MAMF / 132


class Gemm(NamedTuple):
    """One matmul of a layer unit: per sample ``[tokens, k] @ [k, n]`` at TP 1.

    ``row``: row-parallel under tensor parallelism (TP splits ``k``); otherwise column-parallel (TP
    splits ``n``). A matmul TP leaves whole (none today) is not listed. A tuple, so that the per-shape
    cache below hashes a unit's matmuls at C speed.
    """

    k: int
    n: int
    row: bool = False

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.k * self.n


@functools.lru_cache(maxsize=4096)
def flops_per_token(gemms: tuple[Gemm, ...]) -> float:
    """Forward FLOPs per row (token) of ``gemms`` together, at TP 1."""
    return sum(g.flops_per_token for g in gemms)


def fixed_depth(gemm_flops: float, sms: int) -> float:
    """The reduction depth a tile's fixed cost is worth on a device whose GEMMs run at ``gemm_flops`` FLOP/s
    over ``sms`` SMs: ``DEPTH_FIXED`` at the H200's rate per SM, in proportion elsewhere (0 without an SM count)."""
    return DEPTH_FIXED * gemm_flops / sms / REF_FLOPS_PER_SM if sms > 0 else 0.0


def depth_utilisation(depth: float, fixed: float = DEPTH_FIXED) -> float:
    """Rate of a tile reduced over ``depth`` relative to a deep one (1.0 from ``DEPTH_FULL`` on), its fixed cost
    worth ``fixed`` of depth."""
    return min(1.0, depth / (depth + fixed) * (DEPTH_FULL + fixed) / DEPTH_FULL) if depth > 0 else 1.0


def wave_utilisation(rows: int, cols: int, depth: int, sms: int, fixed: float = DEPTH_FIXED) -> float:
    """Fraction of the SM-time one matmul with a ``rows x cols`` output reduced over ``depth`` spends on work.

    Tiles of ``TILE x TILE`` in waves of ``sms``; a single partial wave split along the reduction (split-K)
    into up to as many whole copies of its tiles as the SMs hold and the depth allows (``SPLIT_K_MIN`` each),
    the split that runs fastest, each part of the reduction at its ``depth_utilisation`` (``fixed``: the
    depth its fixed cost is worth, ``fixed_depth``). 1.0 for an output that fills whole waves exactly with a deep reduction.
    """
    if rows <= 0 or cols <= 0 or sms <= 0:
        return 1.0
    tiles = math.ceil(rows / TILE) * math.ceil(cols / TILE)
    most = max(1, min(sms // tiles, depth // SPLIT_K_MIN)) if tiles < sms else 1
    # the split that runs fastest: more parts fill more SMs, each over a shallower (slower) reduction
    return max(rows * cols * split / (math.ceil(tiles * split / sms) * sms * TILE * TILE)
               * depth_utilisation(depth / split, fixed) for split in range(1, most + 1))


@functools.lru_cache(maxsize=65536)
def gemm_utilisation(gemms: tuple[Gemm, ...], tokens: int, tp: int, sms: int,
                     fixed: float = DEPTH_FIXED, wgrad_tokens: int = 0) -> tuple[float, float]:
    """(forward, backward) FLOP-weighted utilisation of ``gemms`` on one rank of a TP group of ``tp``.

    ``tokens``: rows of the activations one rank multiplies per micro-batch (sequence x samples);
    ``wgrad_tokens``: the rows the weight gradient reduces over where they differ (0: ``tokens``; async TP
    chunks its forward and input-gradient matmuls by rows, not its weight gradient).
    Each is the harmonic mean of the matmuls' utilisations weighted by their FLOPs, so that the GEMM
    time is ``GEMM FLOPs / (peak x eff_max x utilisation)``; backward averages the input-gradient and
    weight-gradient matmuls. (1.0, 1.0) without GEMMs or without an SM count.
    """
    if not gemms or sms <= 0 or tokens <= 0:
        return 1.0, 1.0
    work = fwd_time = bwd_time = 0.0
    for g in gemms:
        k = max(1, g.k // tp) if g.row else g.k
        n = g.n if g.row else max(1, g.n // tp)
        flops = float(k) * n
        work += flops
        fwd_time += flops / wave_utilisation(tokens, n, k, sms, fixed)
        bwd_time += (flops / wave_utilisation(tokens, k, n, sms, fixed)
                     + flops / wave_utilisation(k, n, wgrad_tokens or tokens, sms, fixed))
    return work / fwd_time, 2.0 * work / bwd_time


def wave_times(gemms: tuple[Gemm, ...], rows: int, tp: np.ndarray, b_local: np.ndarray, recompute_gemm: np.ndarray,
               sms: int, rate: float | np.ndarray, fixed: float,
               chunked: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds a layer's matmuls spend on idle tiles and waves, per strategy.

    ``rows``: the matmuls' rows per sample (its tokens); ``b_local``: samples per rank per micro-batch;
    ``recompute_gemm``: GEMM FLOPs per sample (TP 1) backward reruns under each strategy's checkpointing;
    ``rate``: the FLOP/s large GEMMs run at (peak x ``eff_max``); ``fixed``: the depth a tile's fixed cost is
    worth on the device (``fixed_depth``: no default, so no device is timed at another's); ``chunked``:
    ``b_local`` is one of async TP's tp row chunks, so the weight gradient still reduces over tp times its rows. What the layer's compute time adds to its
    FLOPs at ``rate``: GEMM FLOPs x (1 / utilisation - 1) / rate, the recomputation at forward's utilisation.
    """
    work = rows * flops_per_token(gemms)  # GEMM FLOPs per sample at TP 1
    tp, b_local = np.broadcast_arrays(np.asarray(tp, dtype=float), np.asarray(b_local, dtype=float))
    # one utilisation per distinct (tp, samples) pair: a search scores hundreds of strategies of a few shapes
    _, first, where = np.unique(tp * 1e9 + b_local, return_index=True, return_inverse=True)
    u = np.array([gemm_utilisation(gemms, max(1, round(rows * float(b_local[i]))), int(tp[i]), sms, fixed,
                                   max(1, round(rows * float(b_local[i] * tp[i]))) if chunked else 0)
                  for i in first])
    u_fwd, u_bwd = u[where.reshape(-1), 0].reshape(tp.shape), u[where.reshape(-1), 1].reshape(tp.shape)
    per_rank = b_local / tp
    fwd = work * per_rank * (1.0 / u_fwd - 1.0) / rate
    bwd = (2.0 * work * (1.0 / u_bwd - 1.0) + recompute_gemm * (1.0 / u_fwd - 1.0)) * per_rank / rate
    return fwd, bwd
