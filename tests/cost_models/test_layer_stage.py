"""layer_costs and stage_cost against hand-computed values on a plain stage (no autopar)."""

from dataclasses import replace

import pytest

from cost_models import CostParams
from cost_models import communication as comm
from cost_models.layer import LayerCost, layer_costs, layout_switch_time, one_layer_cost
from cost_models.stage import stage_cost
from cost_models.transient import transient_bound, transient_bytes
from tests.cost_models.fakes import BW, CBW, HBM, LAT, OneNodeStage, Strat, Unit

P = CostParams(eff_max=0.5, layer_overhead_s=1e-4, overlap_sync=0.0, overlap_zero3=0.0, reserve_gib=1.0,
               act_traffic=0.0)  # the memory-bound term has its own hand test below
U = Unit()
EXACT = {"rel": 1e-12}


def test_ddp_layer_hand_value():
    st = OneNodeStage(n=2, micro_batch_size=4, num_microbatches=4, params=P)  # dp 2, 2 samples per rank
    lc = layer_costs(U, [Strat()], st)
    f = 2 * 1e9 / (1e14 * 0.5) + 1e-4
    assert lc.fwd[0] == pytest.approx(f, **EXACT) and lc.bwd[0] == pytest.approx(2 * f, **EXACT)
    grad = 1e6 * 4
    ar = max(comm.allreduce_time(grad, 2, CBW, LAT), 3 * 0.5 * grad / HBM)  # wire, gamma under it
    step = ar + 1e6 * 36 / HBM  # nothing hidden, then the optimizer over every parameter
    assert lc.step[0] == pytest.approx(step, **EXACT)
    assert lc.cost[0] == pytest.approx(3 * f + step / 4, **EXACT)
    assert lc.mem_states[0] == 18e6 and lc.mem_act[0] == 3e6 * 2  # 2 bf16 + 4 fp32 grad + 12


def test_memory_bound_traffic_hand_value():
    """act_traffic x the saved bytes at HBM speed: a third in forward, two thirds in backward, and
    backward reruns the forward's traffic of whatever checkpointing dropped."""
    p = replace(P, act_traffic=3.0)
    st = OneNodeStage(n=2, micro_batch_size=4, num_microbatches=4, params=p)  # dp 2, 2 samples per rank
    base = layer_costs(U, [Strat(), Strat(ckpt="full")], OneNodeStage(n=2, micro_batch_size=4, params=P))
    lc = layer_costs(U, [Strat(), Strat(ckpt="full")], st)
    traffic_fwd = 3.0 * U.saved_bytes("none") * 2 / HBM / 3
    assert lc.fwd[0] - base.fwd[0] == pytest.approx(traffic_fwd, **EXACT)
    assert lc.bwd[0] - base.bwd[0] == pytest.approx(2 * traffic_fwd, **EXACT)
    dropped = 1 - U.saved_bytes("full") / U.saved_bytes("none")
    assert lc.bwd[1] - base.bwd[1] == pytest.approx((2 + dropped) * traffic_fwd, **EXACT)
    assert (lc.mem_act == base.mem_act).all()  # traffic is time, not memory


def test_tp_sp_full_recompute_hand_value():
    st = OneNodeStage(n=2, micro_batch_size=4, params=P)  # tp 2: dp 1, 4 samples per rank
    lc = layer_costs(U, [Strat(tp=2, ckpt="full", sp=True)], st)
    f = 4 * 1e9 / 2 / (1e14 * 0.5) + 1e-4
    # 2 all-reduces of 2e5 * 4 / 2 bytes each, plus SP's gather of the 1e5 * 4-byte boundary
    tp = 2 * comm.allreduce_time(4e5, 2, CBW, LAT) + comm.allgather_time(4e5, 2, CBW, LAT)
    assert lc.fwd[0] == pytest.approx(f + tp, **EXACT)
    assert lc.bwd[0] == pytest.approx(3 * f + 2 * tp, **EXACT)  # full recompute reruns forward and its collectives
    shard = 800_000 / 2 + 200_000
    assert lc.step[0] == pytest.approx(shard * 36 / HBM, **EXACT)  # dp 1: no gradient sync
    assert lc.mem_act[0] == pytest.approx(1e5 / 2 * 4, **EXACT)


def test_tp_op_recompute_hand_value():
    """ckpt op: backward reruns the layer's op-recompute FLOPs, its all-reduces (no SP) or the all-gather
    half of them (SP), and the memory-bound traffic of what the policy does not keep."""
    st = OneNodeStage(n=2, micro_batch_size=4, params=P)  # tp 2: dp 1, 4 samples per rank
    lc = layer_costs(U, [Strat(tp=2, ckpt="op"), Strat(tp=2, ckpt="op", sp=True)], st)
    f = 4 * 1e9 / 2 / (1e14 * 0.5) + 1e-4
    r = 4 * 0.25e9 / 2 / (1e14 * 0.5) + 1e-4
    ar = 2 * comm.allreduce_time(4e5, 2, CBW, LAT)
    sp = ar + comm.allgather_time(4e5, 2, CBW, LAT)
    assert lc.fwd[0] == pytest.approx(f + ar, **EXACT) and lc.fwd[1] == pytest.approx(f + sp, **EXACT)
    assert lc.bwd[0] == pytest.approx(2 * f + r + 2 * ar, **EXACT)
    assert lc.bwd[1] == pytest.approx(2 * f + r + 1.5 * sp, **EXACT)
    assert lc.mem_act[0] == pytest.approx(1.5e6 / 2 * 4, **EXACT)
    p = replace(P, act_traffic=3.0)
    base = layer_costs(U, [Strat(ckpt="op")], OneNodeStage(n=2, micro_batch_size=4, params=P))
    lc = layer_costs(U, [Strat(ckpt="op")], OneNodeStage(n=2, micro_batch_size=4, params=p))
    traffic_fwd = 3.0 * U.saved_bytes("none") * 2 / HBM / 3
    assert lc.bwd[0] - base.bwd[0] == pytest.approx((2 + 0.5) * traffic_fwd, **EXACT)  # op keeps half of none


def test_zero3_overlap_hand_value():
    p = CostParams(eff_max=0.5, layer_overhead_s=1e-4, overlap_zero3=0.5, act_traffic=0.0)
    st = OneNodeStage(n=4, micro_batch_size=4, params=p)  # dp 4, 1 sample per rank
    lc = layer_costs(U, [Strat(zero=3)], st)
    f = 1e9 / (1e14 * 0.5) + 1e-4
    ag = comm.allgather_time(1e6 * 2, 4, CBW, LAT)  # bf16 parameters
    rs = max(comm.allgather_time(1e6 * 4, 4, CBW, LAT), 3 * 0.75 * 4e6 / HBM)  # fp32 gradients, reduced
    assert lc.fwd[0] == pytest.approx(f + max(0.0, ag - 0.5 * f), **EXACT)
    assert lc.bwd[0] == pytest.approx(2 * f + max(0.0, ag + rs - 0.5 * 2 * f), **EXACT)
    assert lc.step[0] == pytest.approx(1e6 / 4 * 36 / HBM, **EXACT)
    assert lc.mem_states[0] == pytest.approx(18e6 / 4, **EXACT)


def test_vectorised_equals_one_at_a_time():
    st = OneNodeStage(n=4, micro_batch_size=8, num_microbatches=2, params=P)
    strats = [Strat(), Strat(tp=2, zero=1, ckpt="selective"), Strat(tp=4, sp=True), Strat(zero=2, ckpt="full")]
    lc = layer_costs(U, strats, st)
    for i, s in enumerate(strats):
        one = one_layer_cost(U, s, st)
        assert one == LayerCost(lc.cost[i], lc.fwd[i], lc.bwd[i], lc.step[i], lc.mem_states[i], lc.mem_act[i])


def test_layout_switch_and_transient_hand_values():
    st = OneNodeStage(n=4, micro_batch_size=8, params=P)
    assert layout_switch_time(1e5, (2, False), (2, False), st) == 0.0
    # to tp 4: dp 1, each rank gets the 1e5 * 8-byte boundary, forward and backward
    assert layout_switch_time(1e5, (1, False), (4, True), st) == pytest.approx(2 * (LAT + 8e5 / BW), **EXACT)
    # dp 4: 2 samples per rank of the layer's full activations; ZeRO-3 adds two gathered copies of
    # its TP shard of the parameters (bf16); without ZeRO-3 the parameters are resident states
    assert transient_bytes(U, st, Strat()) == pytest.approx(U.saved_bytes("none") * 2, **EXACT)
    assert transient_bytes(U, st, Strat(zero=3)) == pytest.approx(2 * 1e6 * 2 + U.saved_bytes("none") * 2, **EXACT)
    z3_tp2 = transient_bytes(U, st, Strat(tp=2, zero=3))  # tp 2: dp 2, 4 samples per rank, half the TP part
    assert z3_tp2 == pytest.approx(2 * (800_000 / 2 + 200_000) * 2 + U.saved_bytes("none", 2) * 4, **EXACT)
    assert transient_bound(U, st, [Strat(), Strat(zero=3), Strat(tp=2, zero=3)]) == max(
        transient_bytes(U, st, s) for s in (Strat(), Strat(zero=3), Strat(tp=2, zero=3)))


def test_stage_sums_layers_switches_and_memory():
    st = OneNodeStage(n=2, micro_batch_size=4, num_microbatches=4, params=P)
    a, b = Strat(), Strat(tp=2)
    calls = []

    def counted(ly, s, stage):
        calls.append(s)
        return one_layer_cost(ly, s, stage)

    got = stage_cost([U, U], [a, b], st, 3, counted)
    ca, cb = one_layer_cost(U, a, st), one_layer_cost(U, b, st)
    sw = layout_switch_time(U.boundary_bytes, (1, False), (2, False), st)
    assert calls == [a, b]  # the caller's memo is what prices the layers
    assert got.cost == pytest.approx(ca.cost + cb.cost + sw, **EXACT)
    assert got.fwd == pytest.approx(ca.fwd + cb.fwd + sw / 2, **EXACT)
    assert got.bwd == pytest.approx(ca.bwd + cb.bwd + sw / 2, **EXACT)
    assert got.step == pytest.approx(ca.step + cb.step, **EXACT)
    mem = ca.mem_states + 3 * ca.mem_act + cb.mem_states + 3 * cb.mem_act
    transient = max(transient_bytes(U, st, a), transient_bytes(U, st, b))
    assert got.peak_bytes == pytest.approx(mem + transient + P.reserve_bytes, **EXACT)


def test_attention_core_runs_at_its_own_peak():
    """fp8 converts the linear layers only: their FLOPs at the fp8 peak, the attention core's at bf16."""
    st = OneNodeStage(n=1, micro_batch_size=2, params=P, peak_flops=2e14, attn_peak_flops=1e14)
    lc = layer_costs(U, [Strat(), Strat(ckpt="selective"), Strat(ckpt="full")], st)
    lin, attn = (U.flops - U.attn_core_flops) * 2, U.attn_core_flops * 2
    f = lin / (2e14 * 0.5) + attn / (1e14 * 0.5) + 1e-4
    assert lc.fwd[0] == pytest.approx(f, **EXACT) and lc.bwd[0] == pytest.approx(2 * f, **EXACT)
    assert lc.bwd[1] == pytest.approx(2 * f + attn / (1e14 * 0.5) + 1e-4, **EXACT)  # selective reruns the core
    assert lc.bwd[2] == pytest.approx(3 * f, **EXACT)  # full reruns the whole forward


def test_zero3_gathers_slow_down_with_their_collective_efficiency():
    """``zero3_comm_eff`` divides the bandwidth of ZeRO-3's gathers and reduce-scatters only: at 0.5 the
    exposed ZeRO-3 traffic is that of twice the bytes; ZeRO-2's reduce-scatter and plain DP are untouched."""
    import numpy as np

    from cost_models.zero_options import zero_exposed

    f, b = np.full(3, 1.0), np.full(3, 2.0)
    ag, rs = np.full(3, 3.0), np.full(3, 4.0)
    zero = np.array([3, 2, 0])
    f1, b1 = zero_exposed(f, b, ag, rs, zero, 0.5)
    f2, b2 = zero_exposed(f, b, ag, rs, zero, 0.5, 0.5)
    assert list(f1) == [2.5, 0.0, 0.0] and list(b1) == [6.0, 3.0, 0.0]
    assert list(f2) == [5.5, 0.0, 0.0] and list(b2) == [13.0, 3.0, 0.0]


@pytest.mark.parametrize("tp", [1, 2])
def test_framework_gradient_accumulation_is_a_backward_pass_over_the_rank_parameters(tp):
    """grad_accum_bytes (DeepSpeed's BF16_Optimizer: 18) moves that many HBM bytes per parameter the rank holds
    after every micro-batch's backward: the backward grows by it, nothing else does."""
    st = OneNodeStage(n=2, micro_batch_size=2, num_microbatches=4)
    plain = one_layer_cost(U, Strat(tp=tp), st)
    acc = one_layer_cost(U, Strat(tp=tp), replace(st, params=CostParams(grad_accum_bytes=18)))
    shard = U.tp_params / tp + (U.params - U.tp_params)
    assert acc.bwd - plain.bwd == pytest.approx(shard * 18 / HBM, **EXACT)
    assert (acc.fwd, acc.step, acc.mem_states, acc.mem_act) == (plain.fwd, plain.step, plain.mem_states, plain.mem_act)
    assert acc.cost - plain.cost == pytest.approx(shard * 18 / HBM, **EXACT)


def test_each_tp_collective_pays_the_call_cost_in_forward_and_backward():
    """A TP layer's forward runs ``tp_collectives`` calls, its backward as many again (no recomputation): each pays
    ``collective_call_s`` once; a layer without TP pays it once a step, for its gradient sync."""
    st = OneNodeStage(n=2, micro_batch_size=2, num_microbatches=4, params=P)
    slow = replace(st, params=replace(P, collective_call_s=1e-3))
    base, call = layer_costs(U, [Strat(tp=2)], st), layer_costs(U, [Strat(tp=2)], slow)
    assert call.fwd[0] - base.fwd[0] == pytest.approx(U.tp_collectives * 1e-3, **EXACT)
    assert call.bwd[0] - base.bwd[0] == pytest.approx(U.tp_collectives * 1e-3, **EXACT)
    dp_base, dp_call = layer_costs(U, [Strat()], st), layer_costs(U, [Strat()], slow)
    assert (dp_call.fwd[0], dp_call.bwd[0]) == (dp_base.fwd[0], dp_base.bwd[0])
    assert dp_call.step[0] - dp_base.step[0] == pytest.approx(1e-3, **EXACT)
