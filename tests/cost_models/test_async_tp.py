"""Async TP in the cost model: SP's collectives hidden behind the unit's matmuls up to ``async_tp_overlap``,
the boundary gather, one step in tp and the decomposition's HBM copy exposed (hand values, no autopar)."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import CostParams
from cost_models import communication as comm
from cost_models.async_tp import async_tp_exposed
from cost_models.layer import layer_costs
from tests.cost_models.fakes import CBW, HBM, LAT, OneNodeStage, Strat, Unit

P = CostParams(eff_max=0.5, layer_overhead_s=1e-4, overlap_sync=0.0, overlap_zero3=0.0, act_traffic=0.0)
U = Unit()
EXACT = {"rel": 1e-12}



def _hand(overlap: float, bwd_factor: float):
    """(forward, backward) exposed TP seconds of U at tp 2 with sp and async TP, 4 samples per rank."""
    boundary = comm.allgather_time(4e5, 2, CBW, LAT)
    core = 2 * comm.allreduce_time(4e5, 2, CBW, LAT)  # 2 collectives of 2e5 * 4 / 2 bytes
    matmul = (1e9 - 2e8) * 4 / 2 / (1e14 * 0.5)  # the unit's FLOPs less its attention core
    copy = 2 * 2e5 * 4 / HBM

    def one(factor, mm):
        return factor * boundary + factor * core - min(factor * core / 2, overlap * mm) + factor * copy
    return one(1.0, matmul), one(bwd_factor, (1 + bwd_factor) * matmul)


@pytest.mark.parametrize("overlap", [0.5, 0.05])  # 0.5: all but one step in tp hidden; 0.05: matmul-bound
@pytest.mark.parametrize("ckpt,factor", [("none", 1.0), ("full", 2.0)])
def test_async_tp_hand_value(overlap, ckpt, factor):
    st = OneNodeStage(n=2, micro_batch_size=4, params=replace(P, async_tp_overlap=overlap))
    lc = layer_costs(U, [Strat(tp=2, sp=True, ckpt=ckpt), Strat(tp=2, sp=True, ckpt=ckpt, async_tp=True)], st)
    plain_f = 2 * comm.allreduce_time(4e5, 2, CBW, LAT) + comm.allgather_time(4e5, 2, CBW, LAT)
    hand_f, hand_b = _hand(overlap, factor)
    assert lc.fwd[1] - lc.fwd[0] == pytest.approx(hand_f - plain_f, **EXACT)
    assert lc.bwd[1] - lc.bwd[0] == pytest.approx(hand_b - factor * plain_f, **EXACT)
    assert lc.cost[1] < lc.cost[0]  # here it wins
    assert (lc.mem_states[0], lc.mem_act[0]) == (lc.mem_states[1], lc.mem_act[1])


def test_without_overlap_it_only_adds_the_copy_so_plain_tp_dominates():
    st = OneNodeStage(n=2, micro_batch_size=4, params=replace(P, async_tp_overlap=0.0))
    lc = layer_costs(U, [Strat(tp=2, sp=True), Strat(tp=2, sp=True, async_tp=True)], st)
    assert lc.fwd[1] - lc.fwd[0] == pytest.approx(2 * 2e5 * 4 / HBM, **EXACT)
    assert lc.cost[1] > lc.cost[0]


def test_the_flag_without_sp_or_tp_changes_nothing():
    """Plans the rules refuse are not priced as async TP (the cost model never sees a gain there)."""
    st = OneNodeStage(n=2, micro_batch_size=4, params=P)
    lc = layer_costs(U, [Strat(tp=2), Strat(tp=2, async_tp=True), Strat(), Strat(async_tp=True)], st)
    assert lc.cost[0] == lc.cost[1] and lc.cost[2] == lc.cost[3]


_pos = st.floats(0.0, 1e-2, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(_pos, _pos, st.sampled_from([2.0, 4.0, 8.0]), _pos, _pos, st.floats(0.0, 1.0))
def test_exposed_bounds(core, boundary, tp, matmul, copy, overlap):
    """boundary + core/tp + copy <= exposed <= plain + copy; more overlap or matmul time never costs more."""
    args = [np.array([x]) for x in (core + boundary, boundary, tp, matmul, copy)]
    got = float(async_tp_exposed(*args, overlap)[0])
    assert boundary + core / tp + copy - 1e-15 <= got <= core + boundary + copy + 1e-15
    more = float(async_tp_exposed(*args[:3], args[3] * 2, args[4], min(1.0, overlap * 2))[0])
    assert more <= got + 1e-15


def test_chunked_matmuls_pay_their_own_waves():
    # Llama 3 8B's block at TP 8 on 132 SMs: 12 samples of 8192 tokens; each of the 8 chunks has 1/8 of the rows
    from autopar.modelspec import from_zoo
    from cost_models.async_tp import chunked_wave_times
    from cost_models.gemm_shapes import DEPTH_FIXED, wave_times

    block = from_zoo("llama3-8b", seq_len=8192).layers[1]
    tp, b = np.array([8.0]), np.array([12.0])
    fwd, bwd = chunked_wave_times(block, 132, tp, b, 600e12, DEPTH_FIXED)
    whole = wave_times(block.gemms, 8192, tp, b, np.zeros(1), 132, 600e12, DEPTH_FIXED)
    chunks = wave_times(block.gemms, 8192, tp, b / 8, np.zeros(1), 132, 600e12, DEPTH_FIXED, chunked=True)
    assert fwd[0] == pytest.approx(8 * chunks[0][0] - whole[0][0]) and fwd[0] > 0
    assert bwd[0] == pytest.approx(max(0.0, 8 * chunks[1][0] - whole[1][0])) and bwd[0] > 0
    assert chunked_wave_times(block, 0, tp, b, 600e12, DEPTH_FIXED)[0][0] == 0.0  # no SM count: nothing
    assert chunked_wave_times(Unit(), 132, tp, b, 600e12, DEPTH_FIXED)[0][0] == 0.0  # no matmul shapes: nothing


def test_an_async_unit_on_a_gpu_with_sms_pays_the_chunk_waves():
    from autopar.modelspec import from_zoo

    block = from_zoo("llama3-8b", seq_len=8192).layers[1]
    plain, known = OneNodeStage(n=8, micro_batch_size=4), OneNodeStage(n=8, micro_batch_size=4, sms=132)
    strategies = [Strat(tp=8, sp=True), Strat(tp=8, sp=True, async_tp=True)]
    a, b = layer_costs(block, strategies, plain), layer_costs(block, strategies, known)
    extra_sync, extra_async = b.fwd - a.fwd
    assert extra_async > extra_sync > 0  # the same matmuls' waves, plus the chunks'
