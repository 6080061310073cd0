"""Tensors two units share (tied embeddings: the LM head's weight is the token embedding's), as runtimes keep them.

A runtime that gives the later unit its own copy (autopar's runtime always does: runtime/ties.py; Megatron-LM
and DeepSpeed's pipeline engine only on another stage, ``CostParams.tied_copy_one_stage``) holds it as that
unit's own parameters, TP-sharded like them, synced over the unit's data-parallel group and updated by its
optimizer: ``held_params`` adds it to what ``layer_costs`` prices. Once per step the copies' gradients are
summed (``tie_sync_times``), after both units' own gradient syncs. That cost is charged to the earlier unit
(``LayerSpec.shared_params``): in a pipeline it sits on the first stage, whose last backward ends the step,
so the sum cannot start before that stage is done.

Two ways of summing (``CostParams.tied_sync_full``):

* 1, autopar's ``TiedGrads``: each copy's full gradient is rebuilt on its holders (an all-gather over its TP
  group, and over its data-parallel group under ZeRO, which shards it) and all-reduced over every rank
  holding either copy (``Stage.tie_links``).
* 0, Megatron's embedding group (``_allreduce_word_embedding_grads``) and DeepSpeed's tie group
  (``PipelineModule.allreduce_tied_weight_gradients``): each rank all-reduces its TP shard of the gradient
  with the rank holding the same shard on the other stage (``Stage.tie_pair_links``), all pairs at once.

The all-reduce moves one gradient buffer's elements: the dtype the holders keep it in (``grad_bytes``), at most
the data-parallel reduction's (``grad_comm_bytes``), since ``grad_bytes`` counts every buffer a rank keeps.
DeepSpeed's fp16 engine all-reduces the fp16 ``weight.grad`` (2 bytes; its data-parallel reduction may run in
fp32), its BF16 optimizer the fp32 ``_hp_grad`` beside the bf16 one it also keeps (4 of 6; microsoft/DeepSpeed
runtime/pipe/engine.py ``_exec_reduce_tied_grads`` since 56c52238, April 2022), Megatron its fp32 ``main_grad``,
autopar's runtime its fp32 master gradient.
"""

from __future__ import annotations

import numpy as np

from cost_models.collectives import Collectives
from cost_models.params import CostParams


def keeps_copy(stage: object, p: CostParams) -> bool:
    """Whether a unit using an earlier unit's tensor holds its own copy of it on ``stage``: always on
    another stage than the earlier unit's (``Stage.tie_apart``), on the same one as ``p`` says."""
    return bool(stage.tie_apart) or p.tied_copy_one_stage > 0


def held_params(layer: object, stage: object, p: CostParams) -> float:
    """Parameters of an earlier unit that ``layer`` holds a copy of on ``stage`` (0 when it holds none)."""
    tied = getattr(layer, "tied_params", 0)
    return float(tied) if tied and keeps_copy(stage, p) else 0.0


def tie_sync_times(layer: object, tp: np.ndarray, zero: np.ndarray, stage: object, coll: Collectives,
                   p: CostParams) -> np.ndarray:
    """Per strategy, seconds per step to sum the gradients of ``layer``'s tensors a later unit holds a copy of
    (``shared_params``), charged to ``layer``; 0 where there is no copy (one tensor on one stage)."""
    shared = float(getattr(layer, "shared_params", 0))
    out = np.zeros_like(tp, dtype=float)
    if shared <= 0 or not keeps_copy(stage, p):
        return out
    full = shared * min(p.grad_bytes, p.grad_comm_bytes)  # one gradient buffer's element (module docstring)
    dp = stage.n / tp
    for t in np.unique(tp):
        sel = tp == t
        if p.tied_sync_full > 0:
            rebuild = coll.time("allgather", full, stage.tp_links(int(t))) if t > 1 else 0.0
            zero_shard = coll.time("allgather", full / t, stage.dp_links(int(t)))
            rebuild = rebuild + np.where((zero[sel] >= 1) & (dp[sel] > 1), zero_shard, 0.0)
            out[sel] = rebuild + coll.reduced("allreduce", full, stage.tie_links())
        elif stage.tie_apart:
            out[sel] = coll.reduced("allreduce", full / t, stage.tie_pair_links())
    return out
