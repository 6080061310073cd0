"""Expert parallelism in the cost model (cost_models/moe.py): the all-to-all formula, what ep changes in a
layer's time and memory, and that ep = 1 and dense units are priced as before."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from autopar.modelspec.spec import MoESpec
from cost_models import CostParams
from cost_models.communication import alltoall_time
from cost_models.layer import layer_costs
from cost_models.memory import model_state_bytes
from cost_models.moe import alltoall_seconds
from cost_models.transient import transient_bytes
from tests.cost_models.fakes import BW, LAT, OneNodeStage, Strat, Unit

MOE = MoESpec(num_experts=8, top_k=2, expert_params=800_000, expert_flops=6e8, dispatch_bytes=2e5,
              expert_act_bytes=2e6)


@dataclass(frozen=True)
class MoEUnit(Unit):
    params: int = 1_000_000
    tp_params: int = 900_000
    moe: MoESpec | None = MOE



def costs(unit, strategies, stage):
    lc = layer_costs(unit, strategies, stage)
    return {f: getattr(lc, f) for f in ("fwd", "bwd", "step", "cost", "mem_states", "mem_act")}


def test_alltoall_sends_n_minus_one_nths_and_pays_latency_per_peer():
    b = 8e6
    assert float(alltoall_time(b, 1, BW, LAT)) == 0.0
    assert float(alltoall_time(0.0, 8, BW, LAT)) == 0.0
    for n in (2, 4, 8):
        assert float(alltoall_time(b, n, BW, LAT)) == pytest.approx((n - 1) / n * b / BW + (n - 1) * LAT)
    t = [float(alltoall_time(b, n, BW, LAT)) for n in (2, 4, 8, 16)]
    assert t == sorted(t) and t[-1] < b / BW + 15 * LAT + 1e-12  # bounded by the whole buffer once


def test_ep_one_prices_an_moe_unit_exactly_as_a_dense_one():
    stage = OneNodeStage(n=8, micro_batch_size=8)
    dense = replace(MoEUnit(), moe=None)
    s = [Strat(zero=z) for z in range(4)]
    a, b = costs(MoEUnit(), s, stage), costs(dense, s, stage)
    for f in a:
        np.testing.assert_array_equal(a[f], b[f])


def test_ep_divides_the_expert_states_and_zero_shards_over_the_expert_dp_group():
    stage = OneNodeStage(n=8, micro_batch_size=8)
    p = stage.params
    for zero in (0, 1, 3):
        ms = [float(costs(MoEUnit(), [Strat(zero=zero, ep=e)], stage)["mem_states"][0]) for e in (1, 2, 4, 8)]
        if zero == 3:  # ZeRO-3 shards every state over dp already: ep moves the experts' shard, not its size
            assert ms == pytest.approx([ms[0]] * 4)
        else:
            assert ms == sorted(ms, reverse=True) and ms[-1] < ms[0] / 2
        for e, got in zip((2, 4, 8), ms[1:]):
            want = float(model_state_bytes(200_000, zero, 8, p.state_bytes, p.param_bytes, (), p.grad_bytes)
                         + model_state_bytes(800_000 / e, zero, 8 / e, p.state_bytes, p.param_bytes, (), p.grad_bytes))
            assert got == pytest.approx(want)
    # ZeRO-3 with ep = dp: no expert-DP group left to shard over, no gathers of the experts
    assert transient_bytes(MoEUnit(), stage, Strat(zero=3, ep=8)) < transient_bytes(MoEUnit(), stage, Strat(zero=3))


def test_ep_adds_two_all_to_alls_each_way_and_full_recompute_reruns_the_forward_pair():
    p = CostParams(moe_imbalance=1.0)
    stage = OneNodeStage(n=8, micro_batch_size=8, params=p)
    a2a = float(alltoall_seconds(MoEUnit(), stage, 4, np.array([1.0]))[0])
    assert a2a == pytest.approx(float(alltoall_time(MOE.dispatch_bytes, 4, BW, LAT)))
    one, four = (costs(MoEUnit(), [Strat(zero=1, ep=e)], stage) for e in (1, 4))
    assert float(four["fwd"][0] - one["fwd"][0]) == pytest.approx(2 * a2a)
    assert float(four["bwd"][0] - one["bwd"][0]) == pytest.approx(2 * a2a)
    full_one, full_four = (costs(MoEUnit(), [Strat(zero=1, ckpt="full", ep=e)], stage) for e in (1, 4))
    assert float(full_four["bwd"][0] - full_one["bwd"][0]) == pytest.approx(4 * a2a)


def test_all_to_all_time_scales_with_tokens_and_top_k():
    stage = OneNodeStage(n=8, micro_batch_size=8)
    small = float(alltoall_seconds(MoEUnit(), stage, 8, np.array([1.0]))[0])
    big = float(alltoall_seconds(replace(MoEUnit(), moe=replace(MOE, dispatch_bytes=4e5)), stage, 8, np.array([1.0]))[0])
    assert big - small == pytest.approx(7 / 8 * 2e5 * stage.params.moe_imbalance / BW)
    two = float(alltoall_seconds(MoEUnit(), stage, 8, np.array([2.0]))[0])
    assert two - small == pytest.approx(7 / 8 * 2e5 * stage.params.moe_imbalance / BW)


def test_load_imbalance_slows_and_grows_only_expert_parallel_rows():
    even, skew = CostParams(moe_imbalance=1.0), CostParams(moe_imbalance=1.5)
    for ep, changes in ((1, False), (4, True)):
        a = costs(MoEUnit(), [Strat(zero=1, ep=ep)], OneNodeStage(n=8, micro_batch_size=8, params=even))
        b = costs(MoEUnit(), [Strat(zero=1, ep=ep)], OneNodeStage(n=8, micro_batch_size=8, params=skew))
        assert (float(b["fwd"][0]) > float(a["fwd"][0])) is changes
        assert (float(b["mem_act"][0]) > float(a["mem_act"][0])) is changes
        if changes:  # the most loaded rank keeps 0.5 x more expert activations
            assert float(b["mem_act"][0] - a["mem_act"][0]) == pytest.approx(0.5 * MOE.expert_act_bytes)


def test_expert_gradient_sync_shrinks_with_ep():
    stage = OneNodeStage(n=8, micro_batch_size=8, num_microbatches=4)
    steps = [float(costs(MoEUnit(), [Strat(zero=0, ep=e)], stage)["step"][0]) for e in (1, 2, 4, 8)]
    assert steps == sorted(steps, reverse=True) and steps[-1] < steps[0]


def test_mixed_strategies_are_priced_row_by_row():
    stage = OneNodeStage(n=8, micro_batch_size=8)
    s = [Strat(zero=1), Strat(zero=1, ep=4), Strat(zero=3, ep=8), Strat(zero=1, ep=4)]
    together = costs(MoEUnit(), s, stage)
    for i, one in enumerate(s):
        alone = costs(MoEUnit(), [one], stage)
        for f in together:
            assert float(together[f][i]) == pytest.approx(float(alone[f][0]))


def test_a_zero3_rate_bound_counts_the_dense_part_over_dp_and_the_experts_over_their_group():
    """With ep 4 on 8 ranks the dense parameters are sharded over dp 8 and each rank's quarter of the experts over
    the expert group of 2: a framework rate far below the links makes the forward gather (nothing hides it) take
    the bytes a rank receives of both over that rate."""
    rate = 1e-3  # GB/s
    stage = OneNodeStage(n=8, micro_batch_size=8, params=CostParams(overlap_zero3=0.0, zero3_rate_gbps=rate))
    base = replace(stage, params=CostParams(overlap_zero3=0.0))
    dense, experts = MoEUnit().params - MOE.expert_params, MOE.expert_params / 4
    received = (dense * 7 / 8 + experts * 1 / 2) * 2  # bf16 parameters
    slow, fast = costs(MoEUnit(), [Strat(zero=3, ep=4)], stage), costs(MoEUnit(), [Strat(zero=3, ep=4)], base)
    assert float(slow["fwd"][0]) == pytest.approx(float(fast["fwd"][0]) - _gather(fast, base) + received / (rate * 1e9))


def _gather(fast, stage) -> float:
    """The forward gather time the links give (what the rate bound replaces): forward less the same row at ZeRO-1."""
    zero1 = costs(MoEUnit(), [Strat(zero=1, ep=4)], stage)
    return float(fast["fwd"][0]) - float(zero1["fwd"][0])


@dataclass(frozen=True)
class LocalMoEUnit(MoEUnit):
    """autopar's runtime's MoE block (moe_local): TP shards the attention; the router and experts stay whole on
    every rank, each running its own tokens under sequence parallelism."""

    tp_params: int = 150_000
    tp_local_params: int = 820_000


def test_tp_sums_the_gradients_of_the_experts_kept_whole_on_every_rank():
    """One all-reduce over the TP group a step, of the whole gradient (of the rank's ZeRO-3 shard: FSDP reduce-scatters
    over DP first); nothing at tp 1, nothing for Megatron's expert TP (no tp_local_params), the rest unchanged."""
    stage = OneNodeStage(n=8, micro_batch_size=8, params=CostParams(overlap_sync=0.0))  # the step's sync exposed
    p, coll = stage.params, stage.collectives
    unit, megatron = LocalMoEUnit(), replace(LocalMoEUnit(), tp_local_params=0)
    for zero in range(4):
        s = [Strat(tp=2, sp=True, zero=zero), Strat(tp=1, zero=zero)]
        a, b = costs(unit, s, stage), costs(megatron, s, stage)
        share = 820_000 * p.grad_comm_bytes / (4 if zero == 3 else 1)  # dp = 8 / tp 2
        extra = float(coll.reduced("allreduce", share, stage.tp_links(2)))
        assert extra > 0 and float(a["step"][0] - b["step"][0]) == pytest.approx(extra, rel=1e-12)
        assert float(a["step"][1]) == float(b["step"][1])  # tp 1: no TP group
        for f in ("fwd", "bwd", "mem_states", "mem_act"):
            np.testing.assert_array_equal(a[f], b[f])
