"""Megatron's TP schedule in the cost model: no boundary all-gather where the residual stream stays sharded
(``tp_boundary_gather``), and the column-parallel layers' asynchronous backward collectives hidden behind their
gradient matmuls (``tp_async_backward``, cost_models/tp_backward.py). Hand values, no autopar."""

from dataclasses import replace

import numpy as np
import pytest

from cost_models import CostParams
from cost_models import communication as comm
from cost_models.gemm_shapes import Gemm
from cost_models.layer import layer_costs
from cost_models.tp_backward import async_backward, column_flop_share
from tests.cost_models.fakes import CBW, LAT, OneNodeStage, Strat, Unit

P = CostParams(eff_max=0.5, layer_overhead_s=1e-4, overlap_sync=0.0, overlap_zero3=0.0, act_traffic=0.0)
EXACT = {"rel": 1e-12}
# a unit whose 1e9 forward FLOPs per sample hold matmuls of 4e8 FLOPs, 3e8 of them column-parallel
GEMMS = (Gemm(100, 500), Gemm(100, 1000), Gemm(500, 400, row=True))  # 2*(5e4 + 1e5 + 2e5) = 7e5 FLOPs per row


class GemmUnit(Unit):
    gemms = GEMMS
    gemm_rows = 1000  # 7e8 FLOPs per sample in matmuls, 3e8 of them column-parallel


def _core(samples: int = 4) -> float:
    """Forward TP seconds of the fake unit at tp 2, dp 1: its 2 all-reduces of 2e5 / 2 bytes per sample."""
    return 2 * comm.allreduce_time(1e5 * samples, 2, CBW, LAT)


def test_column_flop_share_reads_the_unit_matmuls():
    assert column_flop_share(GemmUnit()) == pytest.approx(2 * (5e4 + 1e5) * 1000 / 1e9, **EXACT)
    assert column_flop_share(Unit()) == 0.0  # no matmuls listed: nothing hides


def test_without_the_boundary_gather_sp_pays_only_its_core():
    st_auto = OneNodeStage(n=2, micro_batch_size=4, params=P)
    st_meg = OneNodeStage(n=2, micro_batch_size=4, params=replace(P, tp_boundary_gather=0.0))
    auto = layer_costs(Unit(), [Strat(tp=2, sp=True)], st_auto)
    meg = layer_costs(Unit(), [Strat(tp=2, sp=True)], st_meg)
    boundary = comm.allgather_time(1e5 * 4, 2, CBW, LAT)  # boundary_bytes 1e5 x 4 samples per rank (dp 1)
    assert auto.fwd[0] - meg.fwd[0] == pytest.approx(boundary, **EXACT)
    assert auto.bwd[0] - meg.bwd[0] == pytest.approx(boundary, **EXACT)  # and its gradient's reduce-scatter


@pytest.mark.parametrize("sp", [False, True])
def test_async_backward_hand_values(sp):
    """Backward = forward's TP time (+ half again under SP, the re-gather) less min(forward's, 2 x the
    column-parallel share of the forward compute): a long compute hides the whole forward's worth."""
    tp_fwd, tp_bwd = np.array([1e-3]), np.array([1e-3])
    long, short = np.array([1.0]), np.array([1e-4])
    share = column_flop_share(GemmUnit())
    got_long = async_backward(GemmUnit(), tp_fwd, tp_bwd, np.array([sp]), long, 1.0)
    got_short = async_backward(GemmUnit(), tp_fwd, tp_bwd, np.array([sp]), short, 1.0)
    regather = 0.5e-3 if sp else 0.0
    assert got_long[0] == pytest.approx(1e-3 + regather - 1e-3, **EXACT)
    assert got_short[0] == pytest.approx(1e-3 + regather - 2 * share * 1e-4, **EXACT)
    assert async_backward(GemmUnit(), tp_fwd, tp_bwd, np.array([sp]), long, 0.0)[0] == 1e-3  # off: unchanged


def test_megatron_schedule_in_layer_costs_hides_backward_only_and_keeps_recompute_exposed():
    meg = replace(P, tp_boundary_gather=0.0, tp_async_backward=1.0)
    st_sync = OneNodeStage(n=2, micro_batch_size=4, params=replace(P, tp_boundary_gather=0.0))
    st_meg = OneNodeStage(n=2, micro_batch_size=4, params=meg)
    strats = [Strat(tp=2), Strat(tp=2, ckpt="full")]
    sync = layer_costs(GemmUnit(), strats, st_sync)
    got = layer_costs(GemmUnit(), strats, st_meg)
    assert np.array_equal(got.fwd, sync.fwd)  # forward collectives stay synchronous
    hidden = sync.bwd - got.bwd
    assert hidden[0] == pytest.approx(_core(), rel=1e-9)  # the fake's compute is long: all of one pass hides
    assert hidden[1] == pytest.approx(hidden[0], rel=1e-9)  # the recomputation's rerun forward stays exposed


def test_an_async_tp_unit_prices_its_backward_by_async_tp_alone():
    strats = [Strat(tp=2, sp=True, async_tp=True)]
    base = replace(P, tp_boundary_gather=0.0)
    off = layer_costs(GemmUnit(), strats, OneNodeStage(n=2, micro_batch_size=4, params=base))
    on = layer_costs(GemmUnit(), strats, OneNodeStage(n=2, micro_batch_size=4, params=replace(base, tp_async_backward=1.0)))
    assert on.bwd[0] == off.bwd[0] and on.fwd[0] == off.fwd[0]
