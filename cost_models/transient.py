"""A layer's transient working set: the memory it needs while it runs beyond its saved activations, per rank,
and what a search reserves for it before it has chosen a strategy (``stage.stage_cost`` adds the largest to a
stage's peak; the search's frontier reserves ``transient_bound`` and prices ``head_excess``)."""

from __future__ import annotations

import numpy as np

from cost_models import moe as expert_parallel
from cost_models.context_parallel import cp_transient_bytes
from cost_models.layer import Layer, Stage, Strategy, shard_params
from cost_models.memory_terms import loss_extra_bytes
from cost_models.ties import held_params
from cost_models.zero_options import transient_copies


def transient_bytes(layer: Layer, stage: Stage, strategy: Strategy) -> float:
    """Working set beyond saved activations while the layer runs under ``strategy``, per rank.

    Its full activations of one micro-batch share (recompute under checkpointing, and the
    activation gradients of backward; times ``act_mem_factor``, as saved activations), and under ZeRO-3 two unsharded copies of its TP shard of the
    parameters (the gathered layer and the prefetched next one; one with ``reshard: false``, zero_options). Without ZeRO-3 the parameters are
    resident and counted in the model states: a TP-8 layer of a 1T model holds no extra copy. A unit with a loss
    adds the logits copies its backward holds beyond those (``memory_terms.loss_extra_bytes``). Where the
    framework casts each parameter's gradient after the backward (``cast_bytes``), the larger of the two.
    """
    return max(_working_bytes(layer, stage, strategy), cast_bytes(layer, stage, strategy.tp))


def _working_bytes(layer: Layer, stage: Stage, strategy: Strategy) -> float:
    """``transient_bytes`` but the gradient cast: the layer's activation working set and ZeRO-3's gathers."""
    b_local, p = stage.micro_batch_size * strategy.tp / stage.n, stage.params
    act = layer.saved_bytes("none", strategy.tp, strategy.sp, p.linear_input_share) * b_local
    act += cp_transient_bytes(layer, strategy.tp, getattr(strategy, "cp", 1), b_local)
    act = (act + loss_extra_bytes(layer, strategy.tp, b_local, p.loss_copies)) * p.act_mem_factor
    if strategy.zero != 3 or strategy.tp >= stage.n:  # ZeRO-3 without data parallelism gathers nothing
        return act
    copies = transient_copies(strategy)  # reshard: false holds its own gathered copy in its model states
    if getattr(strategy, "ep", 1) > 1:  # expert parallel: a rank gathers only its own experts (cost_models.moe)
        return act + copies * expert_parallel.ep_shard_params(layer, strategy.ep, float(strategy.tp)) * p.param_bytes
    held = held_params(layer, stage, p)
    return act + copies * float(shard_params(layer, np.array([float(strategy.tp)]), held)[0]) * p.param_bytes


def largest_param(layer: Layer, held: float = 0.0) -> float:
    """Elements of the largest parameter tensor ``layer`` holds, before TP: its largest matmul weight among those
    it owns (a head's weight is its own only as a held copy of a tied embedding, ``held``), else its TP-sharded
    parameters as one tensor (an embedding's table)."""
    own = float(layer.params) + held
    weights = [float(g.k * g.n) for g in (getattr(layer, "gemms", None) or ()) if g.k * g.n <= own]
    return max(weights) if weights else float(layer.tp_params)


def cast_bytes(layer: Layer, stage: Stage, tp: int) -> float:
    """The gradient copy a framework's per-parameter accumulation makes of ``layer``'s largest parameter
    (``CostParams.grad_cast_bytes`` per element of its TP shard): DeepSpeed's BF16_Optimizer runs
    ``hp_grad.add_(lp.grad.to(float32))`` parameter by parameter after each micro-batch's backward, when that
    micro-batch's own activations are freed (counting them beside it is conservative by one micro-batch's
    saved activations). 0 where the framework casts nothing."""
    p = stage.params
    if p.grad_cast_bytes <= 0:
        return 0.0
    return p.grad_cast_bytes * largest_param(layer, held_params(layer, stage, p)) / tp


def transient_bound(layer: Layer, stage: Stage, strategies: list[Strategy], priced: np.ndarray | None = None) -> float:
    """The most ``transient_bytes`` any of ``strategies`` needs: what a search reserves for the layer
    before it has chosen, so every plan it accepts fits under the plan's own estimate too. ``priced``:
    bytes per strategy the search adds to that strategy's own memory instead (``head_excess``), taken
    off each strategy's transient before the maximum."""
    less = np.zeros(len(strategies)) if priced is None else priced
    return max((transient_bytes(layer, stage, s) - float(x) for s, x in zip(strategies, less)), default=0.0)


def head_excess(layer: Layer, stage: Stage, strategies: list[Strategy]) -> np.ndarray:
    """Per strategy, a head's transient (``transient_bytes``) above the least of ``strategies``: the part that
    varies with the strategy (the loss's logits copies, PyTorch's cross entropy holding 3 at tp 1 and 4 under
    loss parallel; its parameters gathered under ZeRO-3, a tied copy included). A search prices it in the
    strategy's own memory and reserves the rest (``transient_bound`` with ``priced``): its plan still fits
    under its estimate, and a reservation sized for the costliest strategy does not reject a plan whose head
    needs less. Other units: nothing (summed over many units, a priced excess would reject what fits)."""
    if not getattr(layer, "loss_bytes", 0.0):  # every unit but a head: nothing, without a loop per strategy
        return np.zeros(len(strategies))
    t = np.array([transient_bytes(layer, stage, s) for s in strategies], dtype=float)
    return t - t.min() if len(t) else t
