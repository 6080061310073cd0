"""ZeRO-3 ``reshard: false`` and ZeRO-1/2 ``zero_overlap`` priced by cost_models/zero_options.py, against
hand-computed values on a plain stage (no autopar)."""


import pytest

from cost_models import CostParams
from cost_models import communication as comm
from cost_models.layer import layer_costs
from tests.cost_models.fakes import CBW, HBM, LAT, OneNodeStage, Strat, Unit

EXACT = {"rel": 1e-12}
U = Unit()
F = 1e9 / (1e14 * 0.5) + 1e-4  # forward of one sample per rank at eff 0.5, plus the call overhead
AG = comm.allgather_time(1e6 * 2, 4, CBW, LAT)  # bf16 parameters over dp 4
RS = max(comm.allgather_time(1e6 * 4, 4, CBW, LAT), 3 * 0.75 * 4e6 / HBM)  # fp32 gradients, reduced under the wire
OPT = 1e6 / 4 * 36 / HBM  # the optimizer over the owned quarter



def _stage(**params) -> OneNodeStage:
    p = CostParams(**{"eff_max": 0.5, "layer_overhead_s": 1e-4, "act_traffic": 0.0, **params})
    return OneNodeStage(n=4, micro_batch_size=4, num_microbatches=2, params=p)  # dp 4, 1 sample per rank


def test_no_reshard_drops_the_backward_gather_and_holds_the_gathered_parameters():
    st = _stage(overlap_zero3=0.25)
    lc = layer_costs(U, [Strat(zero=3), Strat(zero=3, reshard=False)], st)
    assert lc.fwd[0] == pytest.approx(lc.fwd[1], **EXACT) == pytest.approx(F + max(0.0, AG - 0.25 * F), **EXACT)
    assert lc.bwd[0] == pytest.approx(2 * F + max(0.0, AG + RS - 0.25 * 2 * F), **EXACT)
    assert lc.bwd[1] == pytest.approx(2 * F + max(0.0, RS - 0.25 * 2 * F), **EXACT)  # no second gather
    assert lc.step[1] == pytest.approx(lc.step[0], **EXACT) == pytest.approx(OPT, **EXACT)
    # one whole bf16 copy of the parameters, less the quarter the rank owns, however many are in flight
    assert lc.mem_states[1] - lc.mem_states[0] == pytest.approx(1e6 * 0.75 * 2, **EXACT)
    assert lc.mem_act[1] == lc.mem_act[0]


def test_no_reshard_saves_nothing_when_the_backward_hides_the_gather():
    lc = layer_costs(U, [Strat(zero=3), Strat(zero=3, reshard=False)], _stage(overlap_zero3=1.0))
    assert 2 * F > AG + RS  # the backward is long enough to hide both
    assert lc.cost[1] == pytest.approx(lc.cost[0], **EXACT) and lc.mem_states[1] > lc.mem_states[0]


@pytest.mark.parametrize("g,p", [(1.0, 1.0), (0.3, 0.0), (0.0, 0.7)])
def test_zero1_overlap_hides_the_reduce_scatter_behind_backward_and_the_gather_behind_forward(g, p):
    st = _stage(overlap_sync=0.0, overlap_grad_reduce=g, overlap_param_gather=p)
    lc = layer_costs(U, [Strat(zero=1), Strat(zero=1, zero_overlap=True)], st)
    assert lc.step[0] == pytest.approx(RS + AG + OPT, **EXACT)  # after the last backward, nothing hidden
    exposed = max(0.0, RS - g * 2 * F) + max(0.0, AG - p * F)
    assert lc.step[1] == pytest.approx(exposed + OPT, **EXACT)
    assert (lc.fwd[1], lc.bwd[1], lc.mem_states[1]) == (lc.fwd[0], lc.bwd[0], lc.mem_states[0])


def test_zero2_overlap_hides_only_the_parameter_gather():
    """ZeRO-2's per-micro-batch reduce-scatters are priced as before; its step-level all-gather goes behind the
    next forward."""
    st = _stage(overlap_sync=0.0, overlap_zero3=0.0, overlap_param_gather=0.5)
    lc = layer_costs(U, [Strat(zero=2), Strat(zero=2, zero_overlap=True)], st)
    assert lc.bwd[1] == pytest.approx(lc.bwd[0], **EXACT) == pytest.approx(2 * F + RS, **EXACT)
    assert lc.step[0] == pytest.approx(AG + OPT, **EXACT)
    assert lc.step[1] == pytest.approx(max(0.0, AG - 0.5 * F) + OPT, **EXACT)


def test_a_unit_with_little_compute_stays_exposed():
    """An embedding-like unit (parameters, hardly any FLOPs): nothing runs long enough behind it, so its
    collectives stay almost whole (the first all-gather and the last reduce-scatter of a stage)."""
    emb = Unit(kind="embedding", flops=1e3, attn_core_flops=0.0)
    st = _stage(overlap_sync=0.0, layer_overhead_s=1e-7)  # a GPU's launch cost, not this test stage's 100 us
    lc = layer_costs(emb, [Strat(zero=1), Strat(zero=1, zero_overlap=True)], st)
    f = 1e3 / (1e14 * 0.5) + 1e-7
    assert lc.step[1] == pytest.approx(max(0.0, RS - 2 * f) + max(0.0, AG - f) + OPT, **EXACT)
    assert lc.step[1] > 0.9 * lc.step[0]


def test_defaults_price_old_strategies_as_before():
    """A strategy without the new fields (another implementation of the protocol) costs what it did."""
    from tests.cost_models.fakes import Strat as Plain

    st = _stage(overlap_sync=0.2)
    for z in (0, 1, 2, 3):
        a, b = layer_costs(U, [Plain(zero=z)], st), layer_costs(U, [Strat(zero=z)], st)
        assert (a.cost[0], a.mem_states[0]) == (b.cost[0], b.mem_states[0])


def test_no_reshard_transient_holds_one_prefetched_copy():
    """Its own gathered copy is in the model states already: while it runs only the next unit's prefetch is extra."""
    from cost_models.transient import transient_bytes

    st = _stage()
    act = 3e6 * 1  # saved bytes without checkpointing, one sample per rank
    assert transient_bytes(U, st, Strat(zero=3)) == pytest.approx(act + 2 * 1e6 * 2, **EXACT)
    assert transient_bytes(U, st, Strat(zero=3, reshard=False)) == pytest.approx(act + 1e6 * 2, **EXACT)


def test_a_framework_rate_bounds_zero3_traffic_from_below():
    """A framework that moves its ZeRO-3 traffic at ``zero3_rate_gbps`` per rank (DeepSpeed's of 2021) takes at least
    the bytes a rank receives (gather: 3/4 of the unit's bf16 parameters at dp 4) or sends (reduce-scatter: 3/4 of
    its fp32 gradients) over that rate; where the links are slower, the links' time stays. ZeRO-1 is untouched."""
    rate = 0.1  # GB/s: far below the fake links, so the bound decides
    ag, rs = 1e6 * 0.75 * 2 / (rate * 1e9), 1e6 * 0.75 * 4 / (rate * 1e9)
    assert ag > AG and rs > RS
    lc = layer_costs(U, [Strat(zero=3), Strat(zero=3, reshard=False), Strat(zero=1)],
                     _stage(overlap_zero3=0.0, zero3_rate_gbps=rate))
    assert lc.fwd[0] == pytest.approx(F + ag, **EXACT) and lc.bwd[0] == pytest.approx(2 * F + ag + rs, **EXACT)
    assert lc.bwd[1] == pytest.approx(2 * F + rs, **EXACT)  # no second gather without resharding
    plain = layer_costs(U, [Strat(zero=1)], _stage(overlap_zero3=0.0))
    assert (lc.fwd[2], lc.bwd[2], lc.step[2]) == (plain.fwd[0], plain.bwd[0], plain.step[0])
    fast = layer_costs(U, [Strat(zero=3)], _stage(overlap_zero3=0.0, zero3_rate_gbps=1e6))  # no bound in effect
    assert fast.bwd[0] == pytest.approx(2 * F + AG + RS, **EXACT)
