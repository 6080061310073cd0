"""Memory, compute and pipeline formulas against the published closed forms."""

import pytest

from cost_models.compute import achieved_efficiency, compute_time
from cost_models.memory import activation_bytes, inflight_microbatches, model_state_bytes
from cost_models.pipeline import bubble_fraction, pipeline_step_time


@pytest.mark.parametrize("zero,d,per_param", [
    (0, 8, 16.0), (1, 8, 4 + 12 / 8), (2, 8, 2 + 14 / 8), (3, 8, 16 / 8), (1, 1, 16.0), (3, 1, 16.0),
])
def test_zero_model_states_match_rajbhandari(zero, d, per_param):
    assert model_state_bytes(1e9, zero, d) == pytest.approx(1e9 * per_param)


def test_zero_stages_shrink_monotonically():
    vals = [float(model_state_bytes(7e9, z, 64)) for z in range(4)]
    assert vals == sorted(vals, reverse=True) and vals[0] == pytest.approx(112e9)


def test_inflight_microbatches_1f1b_and_gpipe():
    assert [inflight_microbatches("1f1b", 4, i, 16) for i in range(4)] == [4, 3, 2, 1]
    assert [inflight_microbatches("1f1b", 4, i, 2) for i in range(4)] == [2, 2, 2, 1]
    assert [inflight_microbatches("gpipe", 4, i, 16) for i in range(4)] == [16] * 4


def test_activation_bytes_scale_linearly():
    assert activation_bytes(1e6, 4, 3) == pytest.approx(12e6)


def test_compute_time_is_flops_at_eff_max_plus_overhead():
    assert compute_time(2e10, 1e14, 0.6, 1e-4) == pytest.approx(2e10 / (1e14 * 0.6) + 1e-4)
    assert compute_time(0.0, 1e14, 0.6, 1e-4) == 0.0
    # efficiency saturates at eff_max for large work and collapses for small work
    assert achieved_efficiency(1e18, 1e14, 0.6, 1e-4) == pytest.approx(0.6, rel=1e-4)
    x_half = 1e-4 * 1e14 * 0.6
    assert achieved_efficiency(x_half, 1e14, 0.6, 1e-4) == pytest.approx(0.3)


def test_pipeline_equal_stages_matches_bubble_formula():
    c, m, p = 1.0, 8, 4
    T = pipeline_step_time([c] * p, m)
    assert T == pytest.approx((m + p - 1) * c)
    assert 1 - m * c / T == pytest.approx(bubble_fraction(p, m))


def test_pipeline_uneven_stages_bottleneck_dominates():
    assert pipeline_step_time([1.0, 3.0, 1.0], 10) == pytest.approx(9 * 3.0 + 5.0)
    assert pipeline_step_time([1.0, 1.0], 4, p2p_per_microbatch=0.5) == pytest.approx(3 + 2 + 1.0)
