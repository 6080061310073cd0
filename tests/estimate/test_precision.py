"""A plan's precision in its estimate: GEMMs at the precision's peak, bytes by the table."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cluster.parse import load_cluster
from autopar.estimate import StageContext, estimate_plan
from autopar.modelspec.load import load_model
from autopar.plan.precision import activation_bytes, at_precision
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from cost_models import CostParams
from cost_models.layer import compute_times
from cost_models.params import REFERENCE_MAMF
from cost_models.precision import PRECISIONS


def _estimate(precision: str, zero: int = 0, gpus: int = 1, cluster: str = "A100"):
    model = load_model("gpt3-1.3b", 512, dtype_bytes=activation_bytes(precision))
    c, params = at_precision(load_cluster(f"{gpus}x{cluster}"), CostParams(layer_overhead_s=0.0), precision)
    layers = [StageLayer(ly.name, Strategy(zero=zero)) for ly in model.layers]
    plan = Plan(ModelRef(model.name, model.seq_len, model.num_layers, model.source), c, 4 * gpus,
                [Pipeline(4 * gpus, 4 * gpus, 1, [Stage(list(range(gpus)), layers)])])
    return plan, model, estimate_plan(plan, model, params)


def _peak(precision: str, cluster: str = "A100") -> float:
    """The peak a stage of the cluster at ``precision`` computes at (what every layer's compute time uses)."""
    return StageContext(at_precision(load_cluster(f"1x{cluster}"), CostParams(), precision)[0], (0,), 4, 1).peak_flops


def _ratios(precision: str, cluster: str = "A100") -> tuple[float, float]:
    return StageContext(at_precision(load_cluster(f"1x{cluster}"), CostParams(), precision)[0], (0,), 4, 1).matmul_ratios


# (precision, its peak on an A100, the measured share of it its large matmuls reach: the catalogue's mamf_fp32
# for plain FP32; TF32 has no figure, so it takes the reference's, the A100 bf16 mamf)
SHARES = [("fp32", 19.5, 0.984), ("tf32", 156.0, REFERENCE_MAMF), ("fp16", 312.0, REFERENCE_MAMF)]


@pytest.mark.parametrize("precision, peak, share", SHARES)
def test_compute_runs_its_matmuls_at_the_precisions_share_and_the_rest_at_half_precision_speed(precision, peak, share):
    assert _peak(precision) == pytest.approx(peak * 1e12 * share / REFERENCE_MAMF, rel=1e-12)
    layer = load_model("gpt3-1.3b", 512).layers[1]
    one = np.array([1])
    p = CostParams(layer_overhead_s=0.0)
    times = {q: compute_times(layer, one, 0 * one, 0 * one, one, 4.0 * one, _peak(q), p, None, 0, _ratios(q))
             for q in ("bf16", precision)}
    # per FLOP: the matmul at the column's achievable rate, plus the rest of the layer eff_max leaves
    # (1 / eff_max - 1 / REFERENCE_MAMF of a bf16 peak FLOP) at the bf16 speed, which it keeps
    rest = 1.0 / p.eff_max - 1.0 / REFERENCE_MAMF
    factor = (1.0 / (peak * share) + rest / 312.0) / (1.0 / (312.0 * REFERENCE_MAMF) + rest / 312.0)
    assert times[precision][0][0] / times["bf16"][0][0] == pytest.approx(factor, rel=1e-9)
    assert times[precision][1][0] / times["bf16"][1][0] == pytest.approx(factor, rel=1e-9)
    _, _, bf16 = _estimate("bf16")
    _, _, other = _estimate(precision)
    assert other.step_time_s >= bf16.step_time_s
    assert (other.step_time_s > 2 * bf16.step_time_s) == (factor > 2)  # compute dominates this plan


def test_plain_fp32_layers_run_near_their_matmuls_share_not_at_bf16s_layer_efficiency():
    """An FP32 layer on an H100 reaches about 0.75 of the FP32 peak where a bf16 layer reaches 0.55 of its own:
    the kernels beside the matmuls take the time they take in bf16, small next to CUDA-core matmuls."""
    layer = load_model("gpt3-1.3b", 512).layers[1]
    one, p = np.array([1]), CostParams(layer_overhead_s=0.0)
    reached = {}
    for q, peak in (("bf16", 989e12), ("fp32", 67e12)):
        fwd = compute_times(layer, one, 0 * one, 0 * one, one, 4.0 * one, _peak(q, "H100"), p, None, 0,
                            _ratios(q, "H100"))[0][0]
        reached[q] = layer.flops * 4.0 / fwd / peak
    assert reached["bf16"] == pytest.approx(p.eff_max * 0.803 / REFERENCE_MAMF, rel=1e-9)
    assert 0.74 < reached["fp32"] < 0.778  # below the matmuls' own 0.778 (catalogue mamf_fp32)


def test_fp8_is_faster_by_the_ratio_of_achievable_peaks_on_a_gpu_with_fp8():
    # datasheet peaks times the measured achievable matmul fractions (catalogue mamf_fp8 / mamf)
    assert _peak("fp8", "H100") / _peak("bf16", "H100") == pytest.approx(1979 * 0.709 / (989 * 0.803), rel=1e-12)
    _, _, bf16 = _estimate("bf16", cluster="H100")
    _, _, fp8 = _estimate("fp8", cluster="H100")
    assert fp8.step_time_s < bf16.step_time_s
    assert fp8.max_memory_gib == pytest.approx(bf16.max_memory_gib, rel=1e-12)  # bytes as in bf16


def test_fp32_holds_more_memory_by_the_tables_bytes():
    """Activations and compute-dtype copies double; ZeRO-3 model states stay state_bytes / dp = 16 / dp."""
    _, model, bf16 = _estimate("bf16", zero=0)
    _, _, fp32 = _estimate("fp32", zero=0)
    assert fp32.max_memory_gib > bf16.max_memory_gib
    # fewer state bytes in fp32 (16: no master copy) than bf16's 18: the difference is activations
    assert (PRECISIONS["fp32"].state_bytes, PRECISIONS["bf16"].state_bytes) == (16, 18)
    zero1 = [_estimate(p, zero=1, gpus=8)[2].max_memory_gib for p in ("bf16", "fp32")]
    # ZeRO-1 keeps params + grads whole: 2 + 4 bytes in bf16, 4 + 4 in fp32; the rest is sharded over 8:
    # 12 / 8 in bf16, 8 / 8 in fp32 (Megatron-LM's 6 + 12/d and 8 + 8/d)
    assert zero1[1] - zero1[0] > 1.5 * model.num_params / 2**30 - 1e-9


def test_mfu_is_against_the_precisions_peak():
    _, _, bf16 = _estimate("bf16")
    _, _, fp32 = _estimate("fp32")
    assert bf16.mfu == pytest.approx(bf16.tflops / 312)
    assert fp32.mfu == pytest.approx(fp32.tflops / 19.5)
