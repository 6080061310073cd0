"""The cost model's measured refinements: per-kind compute curves, measured collectives, ZeRO state table."""

from __future__ import annotations

import pytest

from autopar.cluster.parse import load_cluster
from autopar.estimate import StageContext, layer_costs
from autopar.modelspec.spec import LayerSpec
from autopar.plan.schema import Strategy
from cost_models import CostParams
from cost_models.memory import model_state_bytes

RUNTIME_FP32 = ((16.0, 0.0), (8.0, 16.0), (8.0, 16.0), (0.0, 16.0))  # what autopar.runtime holds in fp32


def test_state_table_replaces_the_textbook_formula():
    assert model_state_bytes(1000, 1, 4, table=RUNTIME_FP32) == 1000 * (8 + 16 / 4)
    assert model_state_bytes(1000, 3, 2, table=RUNTIME_FP32) == 1000 * 8
    # a DP group of one shards nothing: every stage holds stage 0's bytes
    assert model_state_bytes(1000, 2, 1, table=RUNTIME_FP32) == 16000
    # without a table: the mixed-precision numbers (bf16 params, fp32 gradient buffer), unchanged
    assert model_state_bytes(1000, 1, 4) == 1000 * (6 + 12 / 4)


def test_params_from_a_file_are_hashable_and_equal_to_the_original():
    p = CostParams(eff_by_kind=(("block", 1, 0, 0.5, 1e-4), ("block", 2, 0, 0.4, 2e-4), ("block", 1, 3, 0.3, 3e-4)),
                   comm_fit=(("allreduce", 2, 1e-4, 1e-9),),
                   state_table=RUNTIME_FP32)
    back = CostParams.from_dict({k: ([list(x) for x in v] if isinstance(v, tuple) else v)
                                 for k, v in p.to_dict().items()})
    assert back == p and hash(back) == hash(p)
    assert back.efficiency("block") == (0.5, 1e-4) and back.efficiency("head") == (p.eff_max, p.layer_overhead_s)
    assert back.efficiency("block", 2) == (0.4, 2e-4) and back.efficiency("block", 4) == (0.5, 1e-4)
    assert back.efficiency("block", 1, 3) == (0.3, 3e-4) and back.efficiency("block", 2, 3) == (0.4, 2e-4)
    assert back.efficiency("block", 1, 2) == (0.5, 1e-4)  # ZeRO-1/2 do not change a call's compute
    assert back.measured_comm("allreduce", 2) == (1e-4, 1e-9) and back.measured_comm("allreduce", 4) is None


BLOCK = LayerSpec("layers.0", "block", params=1_000_000, tp_params=1_000_000, flops=1e9, act_tp_bytes=1e6,
                  boundary_bytes=1e5, tp_divisors=(4,), tp_comm_bytes=2e5, tp_collectives=2, tp_plan="gpt.block")


def _costs(params: CostParams, strategy: Strategy, mbs: int = 2):
    ctx = StageContext(load_cluster("2xcpu"), (0, 1), mbs, 1, params)
    return layer_costs(BLOCK, [strategy], ctx)


def test_measured_collectives_replace_the_formula_for_covered_groups():
    alpha, beta = 3e-4, 1e-9
    fit = tuple((c, 2, alpha, beta) for c in ("allreduce", "allgather", "reduce_scatter"))
    base = CostParams(overlap_sync=0.0, opt_bytes_touched=0)
    measured = CostParams(overlap_sync=0.0, opt_bytes_touched=0, comm_fit=fit)
    grad_bytes = BLOCK.params * base.grad_comm_bytes
    step = _costs(measured, Strategy(zero=0)).step[0]
    assert step == pytest.approx(alpha + beta * grad_bytes)  # DDP: one all-reduce, nothing hidden
    assert _costs(base, Strategy(zero=0)).step[0] != pytest.approx(step)
    # TP all-reduces of activations use the same fit: 2 per forward of tp_comm_bytes / 2 x 2 rows each
    free = CostParams(comm_fit=tuple((c, 2, 0.0, 0.0) for c in ("allreduce", "allgather", "reduce_scatter")))
    tp_fwd = _costs(measured, Strategy(tp=2)).fwd[0] - _costs(free, Strategy(tp=2)).fwd[0]
    assert tp_fwd == pytest.approx(2 * (alpha + beta * BLOCK.tp_comm_bytes / 2 * 2))


def test_per_kind_curve_is_used_for_its_kind_only():
    p = CostParams(act_traffic=0.0, eff_max=0.5, layer_overhead_s=0.0, eff_by_kind=(("block", 1, 0, 0.25, 0.0), ("block", 2, 0, 0.5, 1e-3)))
    fast = _costs(CostParams(act_traffic=0.0, eff_max=0.5, layer_overhead_s=0.0), Strategy(zero=0)).fwd[0]
    assert _costs(p, Strategy(zero=0)).fwd[0] == pytest.approx(2 * fast)
    other = CostParams(act_traffic=0.0, eff_max=0.5, layer_overhead_s=0.0, eff_by_kind=(("head", 1, 0, 0.25, 0.0),))
    assert _costs(other, Strategy(zero=0)).fwd[0] == pytest.approx(fast)
    # one call, both TP degrees: each strategy gets its own curve
    both = layer_costs(BLOCK, [Strategy(tp=1), Strategy(tp=2)], StageContext(load_cluster("2xcpu"), (0, 1), 2, 1, p))
    tp2 = _costs(CostParams(act_traffic=0.0, eff_max=0.5, layer_overhead_s=1e-3), Strategy(tp=2)).fwd[0]
    assert both.fwd[0] == pytest.approx(2 * fast) and both.fwd[1] == pytest.approx(tp2)


def test_state_table_reaches_layer_costs():
    p = CostParams(state_table=RUNTIME_FP32)
    assert _costs(p, Strategy(zero=1)).mem_states[0] == BLOCK.params * (8 + 16 / 2)
    assert _costs(p, Strategy(tp=2, zero=1)).mem_states[0] == BLOCK.params / 2 * 16  # dp 1: nothing sharded
