"""Tensor parallelism's backward as Megatron-LM and Transformer Engine run it: the column-parallel linear
layers' collectives started asynchronously and hidden behind their own gradient matmuls.

Megatron-Core's ``LinearWithGradAccumulationAndAsyncCommunication.backward`` (megatron/core/tensor_parallel/
layers.py, NVIDIA/Megatron-LM core_r0.8.0) and Transformer Engine's ``Linear`` / ``LayerNormLinear`` backward
(transformer_engine/pytorch/module/linear.py, layernorm_linear.py at v1.8) start, with
``CUDA_DEVICE_MAX_CONNECTIONS=1`` so that the collective is scheduled first:

* without sequence parallelism, the all-reduce of a column-parallel layer's input gradient
  (``async_op=True``) and run its weight-gradient matmul meanwhile: every backward TP collective of a
  transformer block (the row-parallel layers' backward has none) can hide;
* with sequence parallelism, the all-gather of the layer's sequence-sharded input, which the weight
  gradient needs (the forward saved only the shard), behind the input-gradient matmul, then the
  reduce-scatter of the input gradient behind the weight-gradient matmul. The row-parallel layers' backward
  all-gathers its output gradient synchronously. Backward therefore moves 1.5 times the forward's bytes
  (the re-gather), of which the forward's worth can hide.

So per micro-batch the block's backward pays the forward's TP time again (plus the re-gather under SP),
less what hides: at most the forward's TP time, and at most ``overlap`` times the column-parallel layers'
backward matmuls (twice their forward FLOPs, a ``LayerSpec.gemms`` share of the forward compute).
Recomputation's rerun forward collectives (``layer.TP_BWD_FACTOR``) stay exposed. autopar's own runtime
runs these collectives synchronously: ``CostParams.tp_async_backward`` 0 by default; a measured file states
1 for a Megatron or Transformer Engine run (``framework``). A unit under async TP (Transformer Engine's userbuffers
overlap, torchtitan's async TP) is priced by ``cost_models.async_tp`` alone, forward and backward.
"""

from __future__ import annotations

import numpy as np


def column_flop_share(layer: object) -> float:
    """Share of a unit's forward FLOPs in its column-parallel matmuls (``gemms`` not ``row``); 0 when the
    unit lists no matmuls (nothing is taken to hide)."""
    gemms, flops = getattr(layer, "gemms", ()), float(getattr(layer, "flops", 0.0))
    if not gemms or flops <= 0:
        return 0.0
    rows = float(getattr(layer, "gemm_rows", 0))
    return min(1.0, sum(g.flops_per_token for g in gemms if not g.row) * rows / flops)


def async_backward(layer: object, tp_fwd: np.ndarray, tp_bwd: np.ndarray, sp: np.ndarray, f_comp: np.ndarray,
                   overlap: float) -> np.ndarray:
    """Backward TP seconds per strategy under Megatron's asynchronous backward collectives (module docstring):
    ``tp_bwd`` (the synchronous count) plus SP's re-gather (half the forward's time) less what hides behind
    ``overlap`` x the column-parallel matmuls' backward (2 x their share of ``f_comp``), never more than the
    forward's TP time. ``tp_bwd`` unchanged at ``overlap`` 0. Never below the recomputation's share."""
    if overlap <= 0:
        return tp_bwd
    regather = np.where(sp, 0.5, 0.0) * tp_fwd
    hidden = np.minimum(tp_fwd, overlap * 2.0 * column_flop_share(layer) * f_comp)
    return tp_bwd + regather - hidden
