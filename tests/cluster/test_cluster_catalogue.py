"""The GPU catalogue: every entry loads with sane figures, aliases resolve, unknown names fail well."""

import re

import pytest

from autopar.cluster import catalogue
from autopar.cluster.catalogue import gpu, gpu_aliases, gpu_names, node_defaults
from autopar.errors import AutoparError

REQUIRED = ["H100-SXM", "H100-PCIe", "H200", "A100-80G", "A100-40G", "V100-32G", "V100-16G", "A6000",
            "L40", "L40S", "A10", "L4", "T4", "RTX4090", "RTX3090", "RTX3080Ti", "cpu"]


def test_catalogue_has_the_required_types():
    assert set(REQUIRED) <= set(gpu_names())


@pytest.mark.parametrize("name", gpu_names())
def test_entry_loads_with_positive_figures(name):
    g = gpu(name)
    assert g.name == name
    assert g.memory_gib > 0 and g.tflops > 0 and g.hbm_gbps > 0
    assert g.pcie_gbps > 0 and g.nvlink_gbps >= 0
    assert g.flops == g.tflops * 1e12 and g.memory_bytes == g.usable_memory_gib * 1024**3 <= g.memory_gib * 1024**3
    d = node_defaults(g)
    assert d.intra_bw_gbps > 0 and d.inter_bw_gbps > 0 and d.intra_lat_us >= 0 and d.inter_lat_us >= 0
    assert d.gpus_per_node >= 0


def test_every_entry_cites_a_source_in_a_comment():
    text = catalogue.CATALOGUE_PATH.read_text().splitlines()
    starts = [i for i, line in enumerate(text) if re.match(r"^  [A-Za-z0-9-]+:\s*$", line)]
    names = [text[i].strip().rstrip(":") for i in starts]
    assert set(gpu_names()) <= set(names)
    for i, name in zip(starts, names):
        if name in gpu_names():
            assert text[i + 1].strip().startswith("#"), f"{name} has no source comment"


def test_datasheet_figures():
    h100 = gpu("H100-SXM")
    assert (h100.memory_gib, h100.tflops, h100.hbm_gbps, h100.nvlink_gbps) == (80, 989, 3350, 450)
    a100 = gpu("A100-80G")
    assert (a100.memory_gib, a100.tflops, a100.nvlink_gbps) == (80, 312, 300)
    assert gpu("A100-40G").memory_gib == 40
    assert gpu("V100-32G").tflops == 125 and gpu("V100-16G").memory_gib == 16
    assert gpu("RTX4090").tflops == pytest.approx(165.2) and gpu("RTX3090").tflops == 71
    assert gpu("H200").memory_gib > gpu("H100-SXM").memory_gib


def test_relative_speeds_are_physical():
    t = {n: gpu(n).tflops for n in gpu_names()}
    assert t["H100-SXM"] == t["H200"] > t["H100-PCIe"] > t["A100-80G"] > t["V100-32G"]
    assert t["L40S"] > t["L40"] > t["RTX4090"] > t["RTX3090"] > t["RTX3080Ti"] > t["T4"] > t["cpu"]
    # SXM parts have NVLink across the node; PCIe and GeForce cards do not
    assert all(gpu(n).nvlink_gbps > 0 for n in ["H100-SXM", "H200", "A100-80G", "A100-40G", "V100-32G"])
    assert all(gpu(n).nvlink_gbps == 0 for n in ["H100-PCIe", "A6000", "L40S", "RTX4090", "RTX3090", "cpu"])


def test_cpu_device_is_modest():
    c = gpu("cpu")
    assert c.vendor == "cpu"
    assert c.memory_gib == 8 and c.tflops < 1 and c.hbm_gbps < 100
    assert node_defaults(c).gpus_per_node == 0  # `NxCPU` puts every process on one machine


@pytest.mark.parametrize("alias,canonical", [
    ("A100", "A100-80G"), ("a100", "A100-80G"), ("A100-80GB", "A100-80G"), ("NVIDIA A100 80GB", "A100-80G"),
    ("H100", "H100-SXM"), ("h100-sxm5", "H100-SXM"), ("4090", "RTX4090"), ("RTX 4090", "RTX4090"),
    ("GeForce RTX 4090", "RTX4090"), ("3090", "RTX3090"), ("3080Ti", "RTX3080Ti"), ("3080ti", "RTX3080Ti"),
    ("GeForce RTX 3080 Ti", "RTX3080Ti"), ("V100", "V100-32G"), ("rtx a6000", "A6000"), ("CPU", "cpu"),
    ("l40s", "L40S"), ("L40", "L40"), ("a10", "A10"), ("l4", "L4"),
])
def test_aliases(alias, canonical):
    assert gpu(alias).name == canonical
    assert gpu(alias) is gpu(canonical)


@pytest.mark.parametrize("name", gpu_names())
def test_every_listed_alias_resolves_to_its_entry(name):
    for alias in gpu_aliases(name):
        assert gpu(alias).name == name


@pytest.mark.parametrize("bad,close", [("A1000", "A100-80G"), ("rtx4080", "RTX4090"), ("H1OO", None)])
def test_unknown_gpu_names_field_and_fix(bad, close):
    with pytest.raises(AutoparError) as e:
        gpu(bad)
    assert e.value.field == "gpu"
    assert repr(bad) in str(e.value) and "autopar list gpus" in str(e.value)
    if close:
        assert close in str(e.value)
    assert "\n" not in str(e.value)


def test_node_defaults_by_class():
    assert node_defaults(gpu("A100")).intra_bw_gbps == 300 and node_defaults(gpu("A100")).gpus_per_node == 8
    assert node_defaults(gpu("H100")).inter_bw_gbps == 400  # DGX H100 override of the sxm class
    assert node_defaults(gpu("A100")).inter_bw_gbps == 200
    assert node_defaults(gpu("4090")).intra_bw_gbps < gpu("4090").pcie_gbps  # no P2P on GeForce
    assert node_defaults(gpu("L40S")).intra_bw_gbps == gpu("L40S").pcie_gbps


@pytest.mark.parametrize("entry,field", [
    ({"memory_gib": 24, "hbm_gbps": 900}, "X.tflops"),
    ({"memory_gib": 24, "tflops": -1, "hbm_gbps": 900}, "X.tflops"),
    ({"memory_gib": 0, "tflops": 10, "hbm_gbps": 900}, "X.memory_gib"),
    ({"memory_gib": 24, "tflops": 10, "hbm_gbps": "fast"}, "X.hbm_gbps"),
    ({"memory_gib": 24, "tflops": 10, "hbm_gbps": 900, "flops": 3}, "X.flops"),
    ({"memory_gib": 24, "tflops": 10, "hbm_gbps": 900, "class": "tpu"}, "X.class"),
    ({"memory_gib": 24, "tflops": 10, "hbm_gbps": 900, "node": {"inter_bw_gbps": "fast"}}, "X.node.inter_bw_gbps"),
    ({"memory_gib": 24, "tflops": 10, "hbm_gbps": 900, "node": {"intra_bw_gbps": "nvswitch"}}, "X.node.intra_bw_gbps"),
    ({"memory_gib": 24, "tflops": 10, "hbm_gbps": 900, "node": {"nics": 2}}, "X.node.nics"),
    ({"memory_gib": 24, "tflops": 10, "hbm_gbps": 900, "pcie_gbps": 0}, "X.pcie_gbps"),
])
def test_custom_entry_errors(entry, field):
    with pytest.raises(AutoparError) as e:
        catalogue.gpu_from_entry("MyGPU", entry, "X")
    assert e.value.field == field and "\n" not in str(e.value) and e.value.fix


def test_custom_entry_defaults_and_node_overrides():
    gpu, cls, over = catalogue.gpu_from_entry(None, {"name": "G", "memory_gib": 8, "tflops": 1, "hbm_gbps": 9,
                                                     "node": {"intra_bw_gbps": "pcie", "gpus_per_node": 4}}, "X")
    assert (gpu.name, gpu.nvlink_gbps, gpu.pcie_gbps, gpu.vendor, cls) == ("G", 0.0, 32.0, "nvidia", "pcie")
    assert over == {"gpus_per_node": 4, "intra_bw_gbps": "pcie"}
    assert node_defaults(gpu, cls, over).intra_bw_gbps == 32.0 and node_defaults(gpu, cls, over).gpus_per_node == 4
