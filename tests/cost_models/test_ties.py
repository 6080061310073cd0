"""Tied tensors (cost_models/ties.py): the later unit's copy is held, synced and updated where the runtime keeps
one, and the copies' gradients are summed once per step on the earlier unit, each runtime its own way."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from cost_models import CostParams
from cost_models.layer import layer_costs
from tests.cost_models.fakes import CBW, LAT, OneNodeStage, Strat, Unit

V_H = 4_000_000  # the tied matrix


@dataclass(frozen=True)
class TiedUnit(Unit):
    tied_params: int = 0
    shared_params: int = 0


HEAD = TiedUnit(kind="head", params=8_000, tp_params=0, tied_params=V_H)
EMBED = TiedUnit(kind="embedding", params=V_H, tp_params=V_H, shared_params=V_H)
AUTOPAR = CostParams()
MEGATRON = replace(AUTOPAR, tied_copy_one_stage=0.0, tied_sync_full=0.0)


def _costs(unit, params, tp=1, zero=0, apart=False, n=4):
    return layer_costs(unit, [Strat(tp=tp, zero=zero)], OneNodeStage(n, 4, params=params, tie_apart=apart))


@pytest.mark.parametrize("tp", [1, 2])
def test_autopar_holds_the_heads_copy_even_beside_the_embedding(tp):
    plain = replace(HEAD, tied_params=0)
    extra = _costs(HEAD, AUTOPAR, tp).mem_states[0] - _costs(plain, AUTOPAR, tp).mem_states[0]
    assert extra == pytest.approx(V_H / tp * AUTOPAR.state_bytes)  # TP-sharded like the head's own weight, no ZeRO
    assert _costs(HEAD, AUTOPAR, tp).step[0] > _costs(plain, AUTOPAR, tp).step[0]  # synced over dp, updated


def test_megatron_shares_one_tensor_on_one_stage_and_copies_it_on_another():
    plain = replace(HEAD, tied_params=0)
    assert _costs(HEAD, MEGATRON).mem_states[0] == _costs(plain, MEGATRON).mem_states[0]
    assert _costs(HEAD, MEGATRON, apart=True).mem_states[0] == _costs(plain, AUTOPAR).mem_states[0] + V_H * 18
    assert _costs(EMBED, MEGATRON).step[0] == _costs(replace(EMBED, shared_params=0), MEGATRON).step[0]


def _sync(params, tp=1, zero=0, apart=False):
    return _costs(EMBED, params, tp, zero, apart).step[0] - _costs(replace(EMBED, shared_params=0), params, tp, zero,
                                                                     apart).step[0]


def test_autopar_all_reduces_the_full_gradient_over_every_holder():
    grad = V_H * min(AUTOPAR.grad_bytes, AUTOPAR.grad_comm_bytes)
    ring = lambda n, b: 2 * (n - 1) / n * b / CBW + 2 * (n - 1) * LAT  # noqa: E731  (one node: the ring)
    assert _sync(AUTOPAR) == pytest.approx(ring(4, grad))  # one stage: its 4 ranks hold both copies
    assert _sync(AUTOPAR, apart=True) == pytest.approx(ring(8, grad))  # with the other stage's 4
    gather = 1 / 2 * grad / CBW + LAT  # TP 2 rebuilds the full gradient first
    assert _sync(AUTOPAR, tp=2) == pytest.approx(ring(4, grad) + gather)
    assert _sync(AUTOPAR, tp=1, zero=3) > _sync(AUTOPAR)  # ZeRO shards it over dp: gathered too


def test_megatron_all_reduces_each_tp_shard_with_its_counterpart():
    grad = V_H * min(MEGATRON.grad_bytes, MEGATRON.grad_comm_bytes)
    assert _sync(MEGATRON) == 0.0  # one tensor: nothing to sum
    assert _sync(MEGATRON, apart=True) == pytest.approx(grad / CBW + 2 * LAT)  # a pair: ring of 2
    assert _sync(MEGATRON, tp=4, apart=True) == pytest.approx(grad / 4 / CBW + 2 * LAT)


def test_the_sync_moves_the_narrower_gradient_buffer():
    fp16_engine = replace(MEGATRON, grad_bytes=2, grad_comm_bytes=4)  # DeepSpeed fp16, fp32_allreduce
    bf16_optimizer = replace(MEGATRON, grad_bytes=6, grad_comm_bytes=4)  # bf16 grad + fp32 _hp_grad
    assert _sync(bf16_optimizer, apart=True) / _sync(fp16_engine, apart=True) == pytest.approx(
        (V_H * 4 / CBW + 2 * LAT) / (V_H * 2 / CBW + 2 * LAT))


def test_units_without_ties_cost_the_same_as_before():
    base = _costs(Unit(), AUTOPAR, apart=True)
    for a, b in zip(np.atleast_1d(base.step), np.atleast_1d(_costs(Unit(), MEGATRON, apart=True).step)):
        assert a == b
