"""The noise ceiling: the pooled spread of re-measured configurations, and what a perfect model scores."""

from __future__ import annotations

import math

import pytest

from autopar.calibrate.noise import ceiling, replicate_sd


def test_replicate_sd_pools_log_deviations_over_the_sets_degrees_of_freedom():
    e = math.exp
    # one set of two at +-0.1: 0.02 over 1 dof; one set of three at -0.2, 0, +0.2: 0.08 over 2 dof
    sd = replicate_sd([[e(0.1), e(-0.1)], [5 * e(-0.2), 5.0, 5 * e(0.2)], [7.0]])
    assert sd == pytest.approx(math.sqrt(0.10 / 3))
    assert replicate_sd([[3.0, 3.0]]) == 0.0
    assert replicate_sd([[3.0], []]) is None


def test_without_noise_a_perfect_model_ranks_perfectly():
    groups = ["a"] * 5 + ["b"] * 3
    measured = [1.0, 1.3, 1.1, 2.0, 1.6, 5.0, 4.0, 4.5]
    assert ceiling(groups, measured, 0.0, draws=20) == {"spearman": 1.0, "regret": 1.0}


def test_noise_lowers_the_ceiling_in_step_with_its_size_and_is_reproducible():
    groups = ["g"] * 12
    measured = [100 + 2 * i for i in range(12)]  # 2% apart: a few percent of noise reorders them
    small, large = ceiling(groups, measured, 0.01, draws=300), ceiling(groups, measured, 0.05, draws=300)
    assert 0.3 < large["spearman"] < small["spearman"] < 1.0
    assert 1.0 < small["regret"] < large["regret"]
    assert ceiling(groups, measured, 0.05, draws=300) == large


def test_groups_too_small_to_rank_give_no_spearman():
    out = ceiling(["a", "a", "b", "b"], [1.0, 2.0, 3.0, 4.0], 0.05, draws=50)
    assert out["spearman"] is None and out["regret"] >= 1.0
