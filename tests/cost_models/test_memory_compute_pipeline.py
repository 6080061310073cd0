"""Memory, compute and pipeline formulas against the published closed forms."""

import numpy as np
import pytest

from cost_models.compute import compute_time, layer_efficiency, memory_bound_time
from cost_models.memory import inflight_microbatches, model_state_bytes
from cost_models.params import REFERENCE_MAMF
from cost_models.pipeline import boundary_p2p_time, pipeline_time


@pytest.mark.parametrize("zero,d,per_param", [
    (0, 8, 18.0), (1, 8, 6 + 12 / 8), (2, 8, 2 + 16 / 8), (3, 8, 18 / 8), (1, 1, 18.0), (3, 1, 18.0),
])
def test_zero_model_states_match_rajbhandari(zero, d, per_param):
    """bf16 params, fp32 gradient buffer, fp32 master + m + v (the defaults), sharded as ZeRO shards them."""
    assert model_state_bytes(1e9, zero, d) == pytest.approx(1e9 * per_param)


@pytest.mark.parametrize("state,param,grad,unsharded,distributed", [
    (18, 2, 4, 18, (6, 12)),  # bf16 params, fp32 gradients
    (20, 2, 2, 20, (4, 16)),  # fp16 params and gradients (fp32 master and main-gradient copy with the optimizer)
    (16, 4, 4, 16, (8, 8)),  # fp32 throughout
])
def test_model_states_match_megatron_lms_table(state, param, grad, unsharded, distributed):
    """Megatron-LM's documented bytes per parameter (api-guide/dist_optimizer), unsharded and with the
    distributed optimizer (ZeRO-1) over d ranks: a + b / d."""
    for d in (2, 8, 64):
        assert model_state_bytes(1.0, 0, d, state, param, (), grad) == pytest.approx(unsharded)
        a, b = distributed
        assert model_state_bytes(1.0, 1, d, state, param, (), grad) == pytest.approx(a + b / d)


def test_zero_stages_shrink_monotonically():
    vals = [float(model_state_bytes(7e9, z, 64)) for z in range(4)]
    assert vals == sorted(vals, reverse=True) and vals[0] == pytest.approx(126e9)


def test_inflight_microbatches_1f1b_and_gpipe():
    assert [inflight_microbatches("1f1b", 4, i, 16) for i in range(4)] == [4, 3, 2, 1]
    assert [inflight_microbatches("1f1b", 4, i, 2) for i in range(4)] == [2, 2, 2, 1]
    assert [inflight_microbatches("gpipe", 4, i, 16) for i in range(4)] == [16] * 4


def test_compute_time_is_flops_at_eff_max_plus_overhead():
    assert compute_time(2e10, 1e14, 0.6, 1e-4) == pytest.approx(2e10 / (1e14 * 0.6) + 1e-4)
    assert compute_time(0.0, 1e14, 0.6, 1e-4) == 0.0
    # the overhead makes small work inefficient: at F = overhead * peak * eff_max half the time is overhead
    x_half = 1e-4 * 1e14 * 0.6
    assert x_half / (compute_time(x_half, 1e14, 0.6, 1e-4) * 1e14) == pytest.approx(0.3)


@pytest.mark.parametrize("ratio", [0.06, 0.5])
def test_layer_efficiency_keeps_the_rest_of_a_slower_layer_at_half_precision_speed(ratio):
    assert layer_efficiency(0.6, 1.0) == 0.6  # half precision: eff_max as it is
    # per FLOP at the column's rate: its matmuls (1 / REFERENCE_MAMF) and the rest of the bf16 layer
    # (1 / eff_max - 1 / REFERENCE_MAMF), which takes ratio of a column FLOP's time on the slower column
    assert 1.0 / layer_efficiency(0.6, ratio) == pytest.approx(1.0 / REFERENCE_MAMF + (1.0 / 0.6 - 1.0 / REFERENCE_MAMF) * ratio)
    assert layer_efficiency(0.6, ratio) > 0.6
    assert np.allclose(layer_efficiency(np.array([0.6, 0.5]), ratio), [layer_efficiency(0.6, ratio), layer_efficiency(0.5, ratio)])


def test_layer_efficiency_leaves_faster_matmuls_at_eff_max():
    """FP8 (ratio about 1.8) keeps eff_max: its frameworks fuse or add the kernels around the matmuls."""
    assert layer_efficiency(0.6, 1.8) == 0.6
    assert np.array_equal(layer_efficiency(np.array([0.6, 0.5]), 1.8), [0.6, 0.5])


def test_memory_bound_time_hand_value():
    assert memory_bound_time(36e9, 2e12) == pytest.approx(0.018)


def test_pipeline_equal_stages_pay_the_bubble():
    c, m, p = 1.0, 8, 4
    T = pipeline_time([c] * p, [0.0] * p, m)
    assert T == pytest.approx((m + p - 1) * c)
    assert 1 - m * c / T == pytest.approx((p - 1) / (m + p - 1))  # the bubble fraction


def test_pipeline_uneven_stages_bottleneck_dominates():
    assert pipeline_time([1.0, 3.0, 1.0], [0.0, 0.0, 0.0], 10) == pytest.approx(9 * 3.0 + 5.0)
    # each boundary's send both ways, once per step: (m - 1) max + sum c + sum P
    assert pipeline_time([1.0, 1.0], [1.0, 0.0], 4) == pytest.approx(3 + 2 + 1.0)


def test_boundary_p2p_hand_value_and_vectorised():
    assert boundary_p2p_time(1e6, 4, 10e9, 5e-6) == pytest.approx(5e-6 + 4e6 / 10e9)
    out = boundary_p2p_time(np.array([0.0, 1e6]), 4, 10e9, 5e-6)
    assert out[0] == 0.0 and out[1] == pytest.approx(5e-6 + 4e6 / 10e9)


def test_slot_overhead_is_paid_by_each_slot_of_the_critical_path():
    # m + p - 1 slots: 10 + 3 - 1 = 12
    assert pipeline_time([1.0, 3.0, 1.0], [0.0, 0.0, 0.0], 10, 0.5) == pytest.approx(9 * 3.0 + 5.0 + 12 * 0.5)
    assert pipeline_time([2.0], [0.0], 4, 0.25) == pytest.approx(4 * 2.0 + 4 * 0.25)
