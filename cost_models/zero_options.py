"""ZeRO's per-micro-batch traffic left exposed (``zero_exposed``), and the cost of two sharding options users
run: FSDP without resharding after forward, and the distributed optimizer with overlapped communication.
``layer.layer_costs`` calls these as a hook.

**ZeRO-3, ``reshard: false``** (FSDP2 ``reshard_after_forward=False``; FSDP1's ``SHARD_GRAD_OP``).
FSDP2 gathers a unit's parameters before its forward and keeps them gathered until its backward has
run, then reshards (the post-backward reshard runs whatever ``reshard_after_forward`` says). Per
micro-batch that is one all-gather (forward) instead of two (forward and backward) and the same
gradient reduce-scatter. Under 1F1B a forward that finds the parameters still gathered (the warm-up
forwards, before the first backward has resharded them) skips its gather, so counting one gather per
micro-batch is exact for GPipe and at most ``pp - 1`` gathers pessimistic for 1F1B. Memory: from the
stage's first forward to the last backward of a micro-batch some micro-batch is between the unit's
forward and backward, so the unit's whole (TP-shard of its) parameters stay resident at the peak: one
unsharded copy per unit, however many micro-batches are in flight (they share it), i.e.
``shard * (1 - 1/dp) * param_bytes`` beyond the ZeRO-3 model states.

**ZeRO-1/2, ``zero_overlap: true``** (Megatron-core's distributed optimizer with
``--overlap-grad-reduce --overlap-param-gather``; torchtitan has no ZeRO-1). Without overlap the
step-level traffic (ZeRO-1: gradient reduce-scatter + parameter all-gather; ZeRO-2: the all-gather,
its reduce-scatters run per micro-batch) runs after the last backward and before the next forward,
hidden only by ``overlap_sync`` of the unit's backward. With overlap:

* the reduce-scatter of a unit's gradients starts as soon as the step's last micro-batch has run the
  unit's backward, behind the backward of the units before it (``overlap_grad_reduce`` x one
  micro-batch's backward). Only the last micro-batch can hide it (the gradients are complete only
  then: Megatron disables the sync for the others), so accumulation does not help;
* the all-gather of a unit's updated parameters is started by the optimizer step and waited for by the
  unit's first forward of the next step, behind the forward of the units before it
  (``overlap_param_gather`` x one micro-batch's forward).

What cannot be hidden: the reduce-scatter of the stage's first unit (the last backward: nothing runs
after it) and the all-gather of its first unit (the first forward: nothing runs before it). Pairing
each unit's collective with its own pass (what keeps the stage cost additive over units) gets this
right for a stage that starts with an embedding, whose pass is tiny against its parameter traffic,
and otherwise is off by one unit's overlap. ZeRO-2's per-micro-batch reduce-scatters are priced as
before (``layer.zero_exposed``). The parameter all-gather of a ZeRO-2 unit with overlap is hidden as
ZeRO-1's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cost_models.params import CostParams


def option_arrays(strategies: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """(reshard, zero_overlap) boolean arrays over ``strategies`` (a strategy without the fields: the
    defaults, True and False)."""
    reshard = np.array([bool(getattr(s, "reshard", True)) for s in strategies], dtype=bool)
    overlap = np.array([bool(getattr(s, "zero_overlap", False)) for s in strategies], dtype=bool)
    return reshard, overlap


def no_reshard_backward(z_bwd: np.ndarray, b_comp: np.ndarray, rs_grad: np.ndarray, zero: np.ndarray,
                        reshard: np.ndarray, overlap_zero3: float) -> np.ndarray:
    """Backward ZeRO seconds not hidden, with ZeRO-3 ``reshard: false`` units paying only their gradient
    reduce-scatter (no second all-gather); other strategies keep ``z_bwd``."""
    kept = (zero == 3) & ~reshard
    return np.where(kept, np.maximum(0.0, rs_grad - overlap_zero3 * b_comp), z_bwd)


def overlapped_sync(sync_exposed: np.ndarray, f_comp: np.ndarray, b_comp: np.ndarray, ag_param: np.ndarray,
                    rs_grad: np.ndarray, zero: np.ndarray, overlap: np.ndarray, p: CostParams) -> np.ndarray:
    """Step-level sync seconds not hidden, per strategy: ``sync_exposed`` (layer.py's, hidden by
    ``overlap_sync``) for strategies without ``zero_overlap``; with it, ZeRO-1's reduce-scatter behind
    ``overlap_grad_reduce`` of one backward plus its all-gather behind ``overlap_param_gather`` of one
    forward, and ZeRO-2's all-gather behind the forward."""
    ag = np.maximum(0.0, ag_param - p.overlap_param_gather * f_comp)
    rs = np.maximum(0.0, rs_grad - p.overlap_grad_reduce * b_comp)
    return np.select([overlap & (zero == 1), overlap & (zero == 2)], [rs + ag, ag], sync_exposed)


def gathered_bytes(shard: np.ndarray, dp: np.ndarray, zero: np.ndarray, reshard: np.ndarray,
                   param_bytes: float) -> np.ndarray:
    """Bytes per rank a ZeRO-3 ``reshard: false`` unit holds at the peak beyond its sharded model states:
    its gathered parameters less the shard it owns (0 for every other strategy, and without DP)."""
    kept = (zero == 3) & ~reshard & (dp > 1)
    return np.where(kept, shard * (1.0 - 1.0 / dp) * param_bytes, 0.0)


def transient_copies(strategy: object) -> float:
    """Unsharded parameter copies a ZeRO-3 unit needs beyond its model states while it runs: 2 (the gathered
    unit and the prefetched next one) when it reshards after forward; 1 (the prefetched next one) with
    ``reshard: false``, whose own gathered copy ``gathered_bytes`` already counts in the model states."""
    return 2.0 if getattr(strategy, "reshard", True) else 1.0


def zero3_floors(shard: np.ndarray, dp: np.ndarray, p: CostParams) -> tuple[np.ndarray, np.ndarray]:
    """(gather, reduce-scatter) seconds below which a ZeRO-3 unit's collectives cannot run where its framework
    moves them at ``zero3_rate_gbps`` per rank (``CostParams``; 0: no such bound, zeros): the bytes one rank
    receives in the gather, (dp - 1) / dp of the unit's ``shard`` parameters at ``param_bytes``, and sends in
    the reduce-scatter, at ``grad_comm_bytes``."""
    if p.zero3_rate_gbps <= 0:
        zeros = np.zeros_like(np.asarray(shard, dtype=float))
        return zeros, zeros
    moved = np.asarray(shard, dtype=float) * (1.0 - 1.0 / np.asarray(dp, dtype=float)) / (p.zero3_rate_gbps * 1e9)
    return moved * p.param_bytes, moved * p.grad_comm_bytes


def zero3_times(ag_param: np.ndarray, rs_grad: np.ndarray, zero3_eff: float,
                floors: tuple = (0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """(gather, reduce-scatter) seconds of a ZeRO-3 unit's per-micro-batch collectives: the modelled times at
    ``zero3_eff`` (``CostParams.zero3_comm_eff``) of their bandwidth, and no faster than ``floors``
    (``zero3_floors``)."""
    return np.maximum(ag_param / zero3_eff, floors[0]), np.maximum(rs_grad / zero3_eff, floors[1])


def zero_exposed(f_comp: np.ndarray, b_comp: np.ndarray, ag_param: np.ndarray, rs_grad: np.ndarray,
                 zero: np.ndarray, overlap: float, zero3_eff: float = 1.0,
                 floors: tuple = (0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of per-micro-batch ZeRO traffic not hidden behind compute.

    ZeRO-3 gathers the parameters in forward and again in backward, and reduce-scatters the
    gradients in backward (``zero3_times``); ZeRO-2 reduce-scatters them. Prefetching hides them behind the
    same pass's compute as far as ``overlap`` (``CostParams.overlap_zero3``) allows.
    """
    ag3, rs3 = zero3_times(ag_param, rs_grad, zero3_eff, floors)
    fwd = np.where(zero == 3, np.maximum(0.0, ag3 - overlap * f_comp), 0.0)
    bwd = np.select([zero == 3, zero == 2], [np.maximum(0.0, ag3 + rs3 - overlap * b_comp),
                                             np.maximum(0.0, rs_grad - overlap * b_comp)], 0.0)
    return fwd, bwd
