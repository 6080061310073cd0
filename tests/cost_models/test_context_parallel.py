"""Context parallel's terms in layer_costs against hand-computed values (cost_models/context_parallel.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cost_models import CostParams
from cost_models import communication as comm
from cost_models.context_parallel import kv_bytes
from cost_models.layer import layer_costs
from cost_models.transient import transient_bytes
from tests.cost_models.fakes import CBW, LAT, OneNodeStage, Strat, Unit, links

P = CostParams(eff_max=0.5, layer_overhead_s=1e-4, overlap_sync=0.0, overlap_zero3=0.0, reserve_gib=1.0,
               act_traffic=0.0)
EXACT = {"rel": 1e-12}


@dataclass(frozen=True)
class KVUnit(Unit):
    kv_bytes: float = 4e5  # K and V per sample


class CPStage(OneNodeStage):
    def cp_links(self, tp: int, cp: int):
        return links(cp)


def test_cp_adds_the_kv_gather_and_nothing_else_per_token():
    """cp 2 x dp 2 on 4 devices vs dp 4: the same tokens per rank (b_local 1), so compute, TP and
    gradient sync (over dp x cp = 4) are equal; CP adds the all-gather of the whole-sequence K/V of the
    rank's sample (forward), its reduce-scatter (backward), and keeps the gathered K/V (no checkpoint)."""
    u, st = KVUnit(), CPStage(n=4, micro_batch_size=4, num_microbatches=2, params=P)
    base, cp = (layer_costs(u, [Strat(cp=c)], st) for c in (1, 2))
    full = 4e5 * 1 * 2  # kv x b_local x c: the rank's one sample's K and V, whole sequence
    ag = comm.allgather_time(full, 2, CBW, LAT)
    assert cp.fwd[0] == pytest.approx(base.fwd[0] + ag, **EXACT)
    assert cp.bwd[0] == pytest.approx(base.bwd[0] + ag, **EXACT)  # reduce-scatter: the all-gather's wire cost
    assert cp.step[0] == base.step[0] and cp.mem_states[0] == base.mem_states[0]
    assert cp.mem_act[0] == pytest.approx(base.mem_act[0] + 4e5 * (2 - 1) * 1 * P.act_mem_factor, **EXACT)


def test_checkpointed_cp_regathers_in_backward_and_keeps_nothing_more():
    u, st = KVUnit(), CPStage(n=4, micro_batch_size=4, num_microbatches=2, params=P)
    base, cp = (layer_costs(u, [Strat(cp=c, ckpt="full")], st) for c in (1, 2))
    ag = comm.allgather_time(4e5 * 2, 2, CBW, LAT)
    assert cp.bwd[0] == pytest.approx(base.bwd[0] + 2 * ag, **EXACT)  # reduce-scatter + the recompute's gather
    assert cp.mem_act[0] == base.mem_act[0]
    # while the attention runs the gathered K/V beyond the local part are held
    extra = transient_bytes(u, st, Strat(cp=2, ckpt="full")) - transient_bytes(u, st, Strat(ckpt="full"))
    assert extra == pytest.approx(4e5 * 1 * 1 * P.act_mem_factor, **EXACT)


def test_kv_bytes_fallback_and_units_without_attention():
    assert kv_bytes(KVUnit()) == 4e5
    assert kv_bytes(Unit()) == 2 * Unit().boundary_bytes  # attention core but no stated K/V: MHA width
    no_attn = Unit(kind="head", attn_core_flops=0.0)
    st = CPStage(n=2, micro_batch_size=2, params=P)
    base, cp = (layer_costs(no_attn, [Strat(cp=c)], st) for c in (1, 2))
    assert cp.fwd[0] == base.fwd[0] and cp.mem_act[0] == base.mem_act[0]
