"""Per-precision peaks in the catalogue, the GPUs added for them, and refusing a precision a GPU lacks."""

from __future__ import annotations

import pytest

from autopar.cli import main
from autopar.cluster import catalogue
from autopar.cluster.cluster import PEAK_FIELDS
from autopar.cluster.parse import cluster_from_doc, load_cluster
from autopar.errors import AutoparError


@pytest.mark.parametrize("name", catalogue.gpu_names())
def test_peaks_are_ordered_as_the_hardware_is(name):
    """fp32 <= tf32 <= bf16 tensor <= fp8, for the columns a GPU has (0: not known)."""
    g = catalogue.gpu(name)
    peaks = [x for x in (g.tflops_fp32, g.tflops_tf32, g.tflops, g.tflops_fp8) if x]
    assert peaks == sorted(peaks)
    assert g.tflops_fp32 > 0  # every catalogue GPU states its plain fp32 rate


@pytest.mark.parametrize("typed, canonical", [
    ("H100 96GB HBM2e (500 W)", "H100-96G-HBM2e"), ("GH200", "GH200"), ("B200", "B200"), ("MI300X", "MI300X"),
    ("A40", "A40"), ("A800 80GB", "A800"), ("H800 SXM", "H800"), ("Titan RTX", "TitanRTX"),
    ("RTX 2080", "RTX2080"), ("GeForce RTX 2080 Ti", "RTX2080Ti"), ("AMD Instinct MI300X", "MI300X"),
])
def test_new_gpus_answer_to_the_names_people_type(typed, canonical):
    assert catalogue.lookup(typed) == canonical


@pytest.mark.parametrize("name, cls, nvlink", [
    ("H100-96G-HBM2e", "sxm", True), ("H800", "sxm", True), ("A800", "sxm", True), ("B200", "sxm", True),
    ("GH200", "sxm", True), ("MI300X", "sxm", True), ("A40", "pcie", False), ("TitanRTX", "geforce", False),
    ("RTX2080", "geforce", False), ("RTX2080Ti", "geforce", False),
])
def test_new_gpus_node_class(name, cls, nvlink):
    g = catalogue.gpu(name)
    assert catalogue.gpu_class(g) == cls and (g.nvlink_gbps > 0) == nvlink


def test_fp8_is_refused_on_a_gpu_without_fp8_naming_the_field():
    cluster = load_cluster("8xA100")
    with pytest.raises(AutoparError) as info:
        cluster.at_precision("fp8")
    assert str(info.value).startswith("gpu A100-80G.tflops_fp8: is not known (0), so precision fp8 cannot be planned")
    assert load_cluster("8xH100").at_precision("fp8").nodes[0].gpu.flops == 1979e12


def test_a_cluster_at_a_precision_computes_at_its_column_and_keeps_the_rest():
    c = load_cluster("2x8xA100-80G")
    fp32 = c.at_precision("fp32")
    assert fp32.precision == "fp32" and c.precision == "bf16"
    assert fp32.nodes[0].gpu.flops == 19.5e12 and c.nodes[0].gpu.flops == 312e12
    assert fp32.to_dict() == c.to_dict()  # the precision is the plan's field, not the cluster document's
    assert c.at_precision("bf16") is c


def test_custom_gpu_without_a_column_refuses_that_precision_only():
    doc = {"gpus": {"X1": {"memory_gib": 24, "tflops": 70, "hbm_gbps": 900}}, "nodes": [{"gpu": "X1", "count": 4}]}
    cluster = cluster_from_doc(doc, None, "c.yaml")
    assert cluster.at_precision("fp16").nodes[0].gpu.flops == 70e12
    with pytest.raises(AutoparError, match=r"^gpu X1\.tflops_fp32: is not known"):
        cluster.at_precision("fp32")
    doc["gpus"]["X1"]["tflops_fp32"] = 35
    assert cluster_from_doc(doc, None, "c.yaml").at_precision("fp32").nodes[0].gpu.flops == 35e12


def test_a_negative_column_is_refused_when_read():
    doc = {"gpus": {"X1": {"memory_gib": 24, "tflops": 70, "hbm_gbps": 900, "tflops_fp8": -1}},
           "nodes": [{"gpu": "X1", "count": 4}]}
    with pytest.raises(AutoparError, match="tflops_fp8"):
        cluster_from_doc(doc, None, "c.yaml")


def test_list_gpus_shows_the_new_gpus_and_their_columns(capsys):
    assert main(["list", "gpus"]) == 0
    out = capsys.readouterr().out
    for name in ("GH200", "B200", "MI300X", "A40", "A800", "H800", "TitanRTX", "RTX2080", "RTX2080Ti",
                 "H100-96G-HBM2e"):
        assert f"\n{name} " in f"\n{out}"
    assert "fp8 1979" in out and set(PEAK_FIELDS) == {"tflops_fp32", "tflops_tf32", "tflops_fp8"}


def test_a_catalogue_gpu_keeps_its_node_class_at_any_precision():
    g = catalogue.gpu("RTX4090")
    fp32 = load_cluster("8x4090").at_precision("fp32").nodes[0].gpu
    assert fp32 != g and catalogue.gpu_class(fp32) == catalogue.gpu_class(g) == "geforce"
    assert catalogue.node_defaults(fp32) == catalogue.node_defaults(g)
