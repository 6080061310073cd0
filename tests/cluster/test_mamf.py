"""Measured achievable matmul efficiency (catalogue mamf / mamf_fp8 / mamf_fp32): GEMMs run at eff_max x the GPU's figure over
the reference A100's; MFU stays against the datasheet; plans, cluster files and profiles carry it as they should."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.cluster import catalogue
from autopar.cluster.parse import cluster_from_doc, load_cluster
from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.modelspec import from_zoo
from autopar.search import SearchOptions, search
from cost_models.params import REFERENCE_MAMF


def test_the_reference_is_the_a100_entry_eff_max_was_set_on():
    a100 = catalogue.gpu("A100-80G")
    assert a100.mamf == REFERENCE_MAMF and a100.matmul_factor("tflops") == 1.0
    assert a100.sustained_flops == a100.flops


@pytest.mark.parametrize("name, precision, column", [("H100", "bf16", "mamf"), ("H100", "fp8", "mamf_fp8"),
                                                     ("H200", "fp8", "mamf_fp8"), ("MI300X", "bf16", "mamf"),
                                                     ("H100", "fp32", "mamf_fp32")])
def test_a_gpu_with_a_figure_runs_its_gemms_at_its_share_of_the_reference(name, precision, column):
    g = replace(catalogue.gpu(name), precision=precision)
    assert 0 < getattr(g, column) < REFERENCE_MAMF
    assert g.sustained_flops == pytest.approx(g.flops * g.sustained * getattr(g, column) / REFERENCE_MAMF, rel=1e-12)


def test_no_figure_no_change_and_tf32_has_none():
    t4 = catalogue.gpu("T4")
    assert t4.mamf == 0 and t4.sustained_flops == pytest.approx(t4.flops * t4.sustained)
    h100 = replace(catalogue.gpu("H100"), precision="tf32")
    assert h100.sustained_flops == pytest.approx(h100.flops)  # TF32 matmuls were not measured
    fp8 = replace(catalogue.gpu("H100"), precision="fp8")
    # under fp8 the attention core runs at the bf16 peak, with the bf16 figure
    assert fp8.sustained_attn_flops == pytest.approx(989e12 * 0.803 / REFERENCE_MAMF, rel=1e-12)


def _without_mamf(cluster):
    gpu = {k: v for k, v in cluster.to_dict()["nodes"][0]["gpu"].items() if not k.startswith("mamf")}
    n = sum(nd.count for nd in cluster.nodes)
    return cluster_from_doc({"nodes": [{"gpu": gpu, "count": n}]}, None, standalone=True)


def test_an_h100_plan_is_slower_by_its_figure_and_its_mfu_is_against_the_datasheet():
    model, cluster = from_zoo("gpt3-1.3b"), load_cluster("1x8xH100")
    plan = search(model, cluster, 16, SearchOptions(), with_baselines=False).plan
    measured, plain = estimate_plan(plan, model), estimate_plan(replace(plan, cluster=_without_mamf(cluster)), model)
    assert plain.step_time_s < measured.step_time_s < plain.step_time_s / (0.803 / REFERENCE_MAMF) + 1e-12
    assert measured.mfu / plain.mfu == pytest.approx(plain.step_time_s / measured.step_time_s, rel=1e-9)


def test_the_plan_keeps_the_figures_and_reads_them_back():
    cluster = load_cluster("1x8xH100")
    gpu = cluster.to_dict()["nodes"][0]["gpu"]
    assert (gpu["mamf"], gpu["mamf_fp8"]) == (0.803, 0.709)
    assert cluster_from_doc(cluster.to_dict(), None, standalone=True).nodes[0].gpu == cluster.nodes[0].gpu
    assert "mamf" not in load_cluster("1x4xT4").to_dict()["nodes"][0]["gpu"]  # not known: not written


@pytest.mark.parametrize("value, problem", [(1.5, r"must be in \[0, 1\]"), (-0.1, "must be >= 0"), ("x", "number")])
def test_a_bad_figure_is_one_line_naming_the_field(value, problem):
    doc = {"nodes": [{"gpu": {"name": "g", "memory_gib": 16, "tflops": 65, "hbm_gbps": 320, "mamf": value},
                      "count": 2}]}
    with pytest.raises(AutoparError, match=f"mamf.*{problem}"):
        cluster_from_doc(doc, None, standalone=True)


def test_matmul_ratio_is_the_columns_achievable_speed_over_half_precisions():
    h100 = catalogue.gpu("H100")
    assert h100.matmul_ratio("tflops") == 1.0
    assert h100.matmul_ratio("tflops_fp32") == pytest.approx(67 * 0.778 / (989 * 0.803), rel=1e-12)
    assert h100.matmul_ratio("tflops_fp8") == pytest.approx(1979 * 0.709 / (989 * 0.803), rel=1e-12)
    gh200 = catalogue.gpu("GH200")  # no FP32 figure: the reference's share
    assert gh200.matmul_ratio("tflops_fp32") == pytest.approx(67 * REFERENCE_MAMF / (989 * 0.838), rel=1e-12)
