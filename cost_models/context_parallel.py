"""Context parallelism's terms in a layer's cost: the K/V all-gather and what it keeps in memory.

Context parallel (CP) of degree c splits every sample's sequence over c ranks (Llama 3's all-gather
CP, "The Llama 3 Herd of Models" section 3.3.2; autopar/runtime/context_parallel.py runs it). With tp
t on a stage of n devices, dp = n / (t c), and a rank holds 1/c of the tokens of mbs / dp samples:
per rank that is ``b_local = mbs t / n`` samples' worth of tokens, exactly what ``layer.layer_costs``
already computes with its ``dp = n / t``. So the existing terms need no change:

* linear-layer FLOPs, activation memory and traffic, TP collectives: per token, divided by c;
* attention FLOPs: each rank's S/c queries against the whole S keys are 1/c of the full S x S product
  the model spec counts for cp 1 (no causal skipping is assumed there either), which is what the
  runtime's masked SDPA computes; with the load-balanced split (2c chunks, rank r holds chunks r and
  2c-1-r) a kernel that skips fully masked blocks also gets an equal 1/c of the causal work per rank;
* gradient sync and ZeRO sharding over dp x c = n / t ranks (parameters are replicated over CP), the
  group ``dp_links(t)`` already names.

What CP adds, per layer with an attention core and per micro-batch (this module):

* forward: an all-gather of K and V over the CP group (ranks with equal TP coordinate inside the
  t c consecutive devices of a replica; ``Stage.cp_links``), output size the full-sequence K and V of
  the rank's samples at its TP share of the KV heads;
* backward: a reduce-scatter of dK and dV of the same size, plus the all-gather again when the layer
  is checkpointed (the runtime gathers inside the attention core, which every mode but ``none``
  recomputes);
* memory: without checkpointing the gathered K and V (less the local part, already counted) stay
  saved for backward; every mode holds them while the attention runs (transient).

Conservative assumption: the K/V collectives are exposed (not overlapped with compute). Meta reports
them as small next to attention at 128K thanks to GQA; a run that overlaps them is faster than this.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cost_models.collectives import Collectives, GroupLinks


def cp_array(strategies: list) -> np.ndarray:
    """CP degree of each strategy as floats (1 where a strategy has no ``cp``)."""
    return np.array([getattr(s, "cp", 1) for s in strategies], dtype=float)


def kv_bytes(layer: object) -> float:
    """Bytes per sample of one layer's K and V at KV-head width (0: the layer has no attention).

    A layer that states ``kv_bytes`` (zoo and HF configs) gives it; one that does not but has an
    attention core is taken at twice its boundary (K and V as wide as the hidden state: MHA's size,
    an upper bound under GQA)."""
    kv = float(getattr(layer, "kv_bytes", 0.0) or 0.0)
    if kv > 0:
        return kv
    return 2.0 * float(getattr(layer, "boundary_bytes", 0.0)) if getattr(layer, "attn_core_flops", 0.0) > 0 else 0.0


def cp_comm_times(layer: object, tp: np.ndarray, cp: np.ndarray, ckpt: np.ndarray, b_local: np.ndarray,
                  cp_links: Callable[[int, int], GroupLinks], coll: Collectives) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the K/V all-gather and dK/dV reduce-scatter of one micro-batch.

    ``b_local``: samples' worth of tokens per rank (mbs t / n); ``ckpt``: checkpoint codes (0 = none).
    """
    fwd, bwd = np.zeros_like(tp), np.zeros_like(tp)
    kv = kv_bytes(layer)
    if kv <= 0:
        return fwd, bwd
    for t, c in {(float(t), float(c)) for t, c in zip(tp, cp) if c > 1}:
        sel = (tp == t) & (cp == c)
        g = cp_links(int(t), int(c))
        full = kv / t * b_local[sel] * c  # gathered K and V of the rank's samples, whole sequence
        ag = coll.time("allgather", full, g)
        rs = coll.time("reduce_scatter", full, g)
        fwd[sel] = ag
        bwd[sel] = rs + np.where(ckpt[sel] != 0, ag, 0.0)
    return fwd, bwd


def cp_kept_bytes(layer: object, tp: np.ndarray, cp: np.ndarray, ckpt: np.ndarray) -> np.ndarray:
    """Saved bytes per ``b_local`` unit that CP adds: the gathered K and V beyond the local part,
    kept for backward without checkpointing (recomputed otherwise)."""
    kv = kv_bytes(layer)
    return np.where((cp > 1) & (ckpt == 0), kv / tp * (cp - 1.0), 0.0)


def cp_transient_bytes(layer: object, tp: int, cp: int, b_local: float) -> float:
    """Bytes the gathered K and V take beyond the local part while the attention runs (one rank)."""
    return kv_bytes(layer) / tp * (cp - 1) * b_local if cp > 1 else 0.0
