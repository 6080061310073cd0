"""GEMM tiles in waves over the SMs: narrow TP shards and small micro-batches run below large-GEMM efficiency."""

from __future__ import annotations

import numpy as np
import pytest

from cost_models.gemm_shapes import SPLIT_K_MIN, TILE, Gemm, gemm_utilisation, wave_times, wave_utilisation

GPT2_MEDIUM = (Gemm(1024, 3072), Gemm(1024, 1024, row=True), Gemm(1024, 4096), Gemm(4096, 1024, row=True))


def test_an_output_of_whole_waves_keeps_every_sm_busy():
    assert wave_utilisation(TILE * 8, TILE * 10, 4096, 40) == 1.0  # 80 tiles: two full waves of 40
    assert wave_utilisation(TILE * 8, TILE * 10, 4096, 0) == 1.0  # SM count not known: no quantisation


def test_one_tile_more_than_a_wave_pays_a_second_wave():
    assert wave_utilisation(TILE * 41, TILE, 4096, 40) == pytest.approx(41 / 80)


def test_a_partial_tile_costs_a_whole_tile():
    assert wave_utilisation(TILE * 40 + 1, TILE, 64, 40) == pytest.approx((TILE * 40 + 1) / (TILE * 80))


def test_a_small_output_splits_its_reduction_where_it_is_deep_enough():
    deep, shallow = wave_utilisation(TILE, TILE * 4, 16 * SPLIT_K_MIN, 40), wave_utilisation(TILE, TILE * 4, 256, 40)
    assert deep == pytest.approx(40 / 40) and shallow == pytest.approx(4 / 40)
    assert wave_utilisation(TILE, TILE * 3, 16 * SPLIT_K_MIN, 40) == pytest.approx(39 / 40)  # 13 whole copies


def test_narrow_shards_and_small_micro_batches_lose_utilisation_on_a_t4():
    u = {(tp, b): gemm_utilisation(GPT2_MEDIUM, 1024 * b, tp, 40) for tp in (1, 2, 4) for b in (1, 8)}
    assert u[(4, 1)][0] < u[(2, 1)][0] < u[(1, 1)][0] < u[(1, 8)][0] <= 1.0
    assert u[(4, 1)][1] < u[(4, 8)][1] and 0.6 < u[(4, 1)][0] < 0.85
    assert gemm_utilisation(GPT2_MEDIUM, 1024, 4, 0) == (1.0, 1.0)


def test_large_gemms_are_nearly_unaffected():
    gpt3 = (Gemm(12288, 36864), Gemm(12288, 12288, row=True), Gemm(12288, 49152), Gemm(49152, 12288, row=True))
    fwd, bwd = gemm_utilisation(gpt3, 2048, 8, 108)
    assert fwd > 0.9 and bwd > 0.9


def test_wave_times_are_the_idle_share_of_the_gemm_work():
    tp, b = np.array([1.0, 4.0]), np.array([1.0, 1.0])
    rate = 24e12
    fwd, bwd = wave_times(GPT2_MEDIUM, 1024, tp, b, np.zeros(2), 40, rate)
    work = 1024 * sum(g.flops_per_token for g in GPT2_MEDIUM)
    for i, t in enumerate((1, 4)):
        u_f, u_b = gemm_utilisation(GPT2_MEDIUM, 1024, t, 40)
        assert fwd[i] == pytest.approx(work / t * (1 / u_f - 1) / rate)
        assert bwd[i] == pytest.approx(2 * work / t * (1 / u_b - 1) / rate)
    full, _ = wave_times(GPT2_MEDIUM, 1024, tp, b, np.full(2, work), 40, rate)[1], None
    assert np.all(full > bwd)  # recomputing the matmuls reruns their idle waves too
    none = wave_times(GPT2_MEDIUM, 1024, tp, b, np.zeros(2), 0, rate)
    assert np.all(none[0] == 0) and np.all(none[1] == 0)
