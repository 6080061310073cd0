"""The B / W split of a layer's backward under the zero-bubble schedule."""

from __future__ import annotations

import pytest

from cost_models.layer import compute_times, one_layer_cost, strategy_arrays
from cost_models.zero_bubble import weight_grad_time
from tests.cost_models.fakes import OneNodeStage, Strat, Unit


def _forward_compute(unit: Unit, strat: Strat, stage: OneNodeStage) -> float:
    tp, zero, ckpt, _ = strategy_arrays([strat])
    dp = stage.n / tp
    f, _ = compute_times(unit, tp, zero, ckpt, dp, stage.micro_batch_size / dp, stage.peak_flops, stage.params,
                         stage.attn_peak_flops)
    return float(f[0])


@pytest.mark.parametrize("strat", [Strat(), Strat(tp=2), Strat(ckpt="full"), Strat(ckpt="selective", zero=2)])
def test_w_is_the_forward_of_the_weight_bearing_part(strat):
    """W = the forward compute of the FLOPs outside the attention core (a linear's weight gradient costs its
    forward), whatever the recomputation, TP split or ZeRO stage (those stay in B); W < the backward."""
    stage = OneNodeStage(n=2, micro_batch_size=4)
    unit = Unit()
    w = weight_grad_time(unit, strat, stage)
    assert w == pytest.approx(_forward_compute(unit, strat, stage) * (1 - unit.attn_core_flops / unit.flops))
    assert 0 < w < one_layer_cost(unit, strat, stage).bwd


def test_attention_core_and_flopless_units_have_no_w():
    stage = OneNodeStage(n=2, micro_batch_size=4)
    assert weight_grad_time(Unit(attn_core_flops=1e9), Strat(), stage) == 0.0
    assert weight_grad_time(Unit(flops=0.0, attn_core_flops=0.0), Strat(), stage) == 0.0
