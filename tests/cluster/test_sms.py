"""The catalogue's SM counts: sourced per GPU, optional for a custom GPU, written into the plan's cluster."""

from __future__ import annotations

import pytest

from autopar.cluster.catalogue import describe_gpu, gpu, gpu_names
from autopar.cluster.parse import cluster_from_doc, load_cluster
from autopar.errors import AutoparError

KNOWN = {"T4": 40, "V100-16G": 80, "A100-80G": 108, "H100-SXM": 132, "H100-PCIe": 114, "L4": 58, "RTX3090": 82}


@pytest.mark.parametrize("name,sms", sorted(KNOWN.items()))
def test_whitepaper_sm_counts(name, sms):
    assert gpu(name).sms == sms and f"{sms} SMs" in describe_gpu(name)


def test_every_nvidia_gpu_states_its_sms_and_amd_is_left_out():
    assert [n for n in gpu_names() if gpu(n).vendor == "nvidia" and not gpu(n).sms] == []
    assert gpu("MI300X").sms == 0 and gpu("B200").sms == 148


def one_node(**extra):
    g = {"name": "g", "memory_gib": 16, "tflops": 65, "hbm_gbps": 320, **extra}
    return cluster_from_doc({"nodes": [{"gpu": g, "count": 2}]}, None, standalone=True)


def test_a_custom_gpu_may_leave_it_out_or_give_it_and_the_plan_keeps_it():
    assert one_node().nodes[0].gpu.sms == 0
    cluster = one_node(sms=40)
    doc = cluster.to_dict()
    assert doc["nodes"][0]["gpu"]["sms"] == 40
    assert cluster_from_doc(doc, None, standalone=True).nodes[0].gpu == cluster.nodes[0].gpu
    assert "sms" not in one_node().to_dict()["nodes"][0]["gpu"]
    assert load_cluster("1x4xT4").to_dict()["nodes"][0]["gpu"]["sms"] == 40


@pytest.mark.parametrize("bad", [-1, 2.5, "many"])
def test_a_bad_count_is_one_line_naming_the_field(bad):
    with pytest.raises(AutoparError, match="sms"):
        one_node(sms=bad)
