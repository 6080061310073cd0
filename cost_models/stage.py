"""A pipeline stage's cost: its layers' costs summed in layer order, plus layout switches and memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from cost_models.layer import Layer, LayerCost, Stage, Strategy, layout_switch_time, one_layer_cost
from cost_models.transient import transient_bytes

LayerCostFn = Callable[[Layer, Strategy, Stage], LayerCost]


class StageCost(NamedTuple):
    """Per rank: seconds per micro-batch (``cost`` = fwd + bwd + step / m + layout switches) and peak bytes."""

    cost: float
    fwd: float
    bwd: float
    step: float
    peak_bytes: float  # states + in-flight activations + the largest transient + the framework reserve


def stage_cost(layers: Sequence[Layer], strategies: Sequence[Strategy], stage: Stage, inflight: int,
               layer_cost: LayerCostFn = one_layer_cost) -> StageCost:
    """Cost of ``layers`` run in order on ``stage`` with ``inflight`` micro-batches held at its peak.

    Summed in layer order exactly as the search's dynamic programme sums them (so the two agree to
    the last bit). A layout switch between adjacent layers counts half to forward, half to backward.
    ``layer_cost``: ``one_layer_cost`` or a memoised equivalent (the caller owns any cache).
    """
    cost = fwd = bwd = step = 0.0
    mem = 0.0
    transient = 0.0
    prev_layout = None
    for i, (ly, s) in enumerate(zip(layers, strategies)):
        c, f, b, st, ms, ma = layer_cost(ly, s, stage)
        layout = (s.tp, s.sp)
        sw = 0.0
        if prev_layout is not None:
            sw = layout_switch_time(layers[i - 1].boundary_bytes, prev_layout, layout, stage)
        cost = cost + (c + sw)
        mem = mem + (ms + inflight * ma)
        fwd += f + sw / 2
        bwd += b + sw / 2
        step += st
        transient = max(transient, transient_bytes(ly, stage, s))
        prev_layout = layout
    return StageCost(cost, fwd, bwd, step, mem + transient + stage.params.reserve_bytes)
