"""GEMM tiles in waves over the SMs: narrow TP shards and small micro-batches run below large-GEMM efficiency."""

from __future__ import annotations

import numpy as np
import pytest

from cost_models.gemm_shapes import (
    DEPTH_FIXED,
    DEPTH_FULL,
    SPLIT_K_MIN,
    TILE,
    Gemm,
    depth_utilisation,
    fixed_depth,
    gemm_utilisation,
    wave_times,
    wave_utilisation,
)

GPT2_MEDIUM = (Gemm(1024, 3072), Gemm(1024, 1024, row=True), Gemm(1024, 4096), Gemm(4096, 1024, row=True))


def test_an_output_of_whole_waves_keeps_every_sm_busy():
    assert wave_utilisation(TILE * 8, TILE * 10, 4096, 40) == 1.0  # 80 tiles: two full waves of 40
    assert wave_utilisation(TILE * 8, TILE * 10, 4096, 0) == 1.0  # SM count not known: no quantisation


def test_one_tile_more_than_a_wave_pays_a_second_wave():
    assert wave_utilisation(TILE * 41, TILE, 4096, 40) == pytest.approx(41 / 80)


def test_a_partial_tile_costs_a_whole_tile():
    assert wave_utilisation(TILE * 40 + 1, TILE, 4096, 40) == pytest.approx((TILE * 40 + 1) / (TILE * 80))


def test_a_small_output_splits_its_reduction_where_it_is_deep_enough():
    # 10 copies of 4 tiles fill 40 SMs, each part reducing over a tenth of the depth
    deep = 10 * DEPTH_FULL
    assert wave_utilisation(TILE, TILE * 4, deep, 40) == pytest.approx(depth_utilisation(deep / 10))
    assert wave_utilisation(TILE, TILE * 3, 13 * DEPTH_FULL, 40) == pytest.approx(39 / 40)  # 13 whole copies
    assert wave_utilisation(TILE, TILE * 4, 256, 40) == pytest.approx(4 / 40 * depth_utilisation(256))  # no split
    # a split into shallower parts is taken only where it runs faster than fewer, deeper parts
    some = wave_utilisation(TILE, TILE * 4, 4 * SPLIT_K_MIN, 40)
    assert some == max(k / 10 * depth_utilisation(4 * SPLIT_K_MIN / k) for k in (1, 2, 3, 4))


def test_a_shallow_reduction_runs_below_a_deep_one():
    """The fixed cost of each tile's reduction (measured on an H200: 0.46 / 0.76 / 0.94 of the plateau at depth
    128 / 512 / 1024, benchmarks/results/gpu_single_device.json)."""
    measured = {128: 0.456, 256: 0.614, 512: 0.758, 768: 0.843, 1024: 0.936, 1536: 0.985}
    for depth, share in measured.items():
        assert depth_utilisation(depth) == pytest.approx(share, abs=0.05)
    assert depth_utilisation(DEPTH_FULL) == depth_utilisation(16 * DEPTH_FULL) == 1.0
    shares = [depth_utilisation(d) for d in range(64, DEPTH_FULL + 1, 64)]
    assert shares == sorted(shares)
    # a TP-8 shard of a 4096-wide row-parallel matmul reduces over 512: slower per FLOP than TP 1 (measured at
    # 8192 tokens on the H200: 457 against 796 TFLOP/s)
    assert wave_utilisation(8192, 4096, 512, 132) < 0.8 < 0.95 < wave_utilisation(8192, 4096, 4096, 132)


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
    fwd, bwd = wave_times(GPT2_MEDIUM, 1024, tp, b, np.zeros(2), 40, rate, DEPTH_FIXED)
    work = 1024 * sum(g.flops_per_token for g in GPT2_MEDIUM)
    for i, t in enumerate((1, 4)):
        u_f, u_b = gemm_utilisation(GPT2_MEDIUM, 1024, t, 40)
        assert fwd[i] == pytest.approx(work / t * (1 / u_f - 1) / rate)
        assert bwd[i] == pytest.approx(2 * work / t * (1 / u_b - 1) / rate)
    full, _ = wave_times(GPT2_MEDIUM, 1024, tp, b, np.full(2, work), 40, rate, DEPTH_FIXED)[1], None
    assert np.all(full > bwd)  # recomputing the matmuls reruns their idle waves too
    none = wave_times(GPT2_MEDIUM, 1024, tp, b, np.zeros(2), 0, rate, DEPTH_FIXED)
    assert np.all(none[0] == 0) and np.all(none[1] == 0)


def test_the_fixed_cost_is_time_so_its_depth_follows_the_rate_per_sm():
    """The H200 the fit was measured on pays DEPTH_FIXED; a slower SM (a T4's, an FP32 matmul on the CUDA cores)
    runs the main loop slower, so the same fixed time is worth less depth; an FP8 matmul's, twice as fast, more."""
    from autopar.cluster.parse import load_cluster

    def gpu(spec: str, precision: str = "bf16"):
        g = load_cluster(spec).at_precision(precision).nodes[0].gpu
        return fixed_depth(g.sustained_flops, g.sms)

    assert gpu("1xH200") == pytest.approx(DEPTH_FIXED)  # REF_FLOPS_PER_SM is the catalogue's H200
    assert gpu("1xH100") == pytest.approx(DEPTH_FIXED)  # same SMs, same peak and mamf
    assert gpu("1xT4") < DEPTH_FIXED / 3 and gpu("1xH200", "fp32") < DEPTH_FIXED / 10
    assert gpu("1xH200", "fp8") > 1.5 * DEPTH_FIXED
    assert fixed_depth(1e15, 0) == 0.0 and depth_utilisation(64, 0.0) == 1.0


def test_async_tp_chunks_keep_the_weight_gradient_over_all_rows():
    """Async TP splits its forward and input-gradient matmuls into tp row chunks, not its weight gradient: a
    chunk's weight gradient still reduces over every row, so the depth term does not charge it a shallow one."""
    llama8b = (Gemm(4096, 6144), Gemm(4096, 4096, row=True), Gemm(4096, 28672), Gemm(14336, 4096, row=True))
    tp, b, rate, fixed = np.array([8.0]), np.array([1.0 / 8]), 600e12, DEPTH_FIXED
    u_chunk = gemm_utilisation(llama8b, 1024, 8, 132, fixed, 8192)
    assert u_chunk[1] > gemm_utilisation(llama8b, 1024, 8, 132, fixed)[1]  # a 1024-deep weight gradient is slower
    assert u_chunk[0] == gemm_utilisation(llama8b, 1024, 8, 132, fixed)[0]  # the forward is chunked either way
    _, bwd = wave_times(llama8b, 8192, tp, b, np.zeros(1), 132, rate, fixed, chunked=True)
    work = 8192 * sum(g.flops_per_token for g in llama8b)
    assert bwd[0] == pytest.approx(2 * work * (b[0] / 8) * (1 / u_chunk[1] - 1) / rate)
