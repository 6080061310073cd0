"""GDDR memory with ECC on: 1/16 of the memory holds ECC bits and memory-bound kernels reach 80% of the line rate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.cluster.catalogue import describe_gpu, gpu
from autopar.cluster.cluster import ECC_BANDWIDTH_FRACTION, ECC_MEMORY_FRACTION, GIB
from autopar.cluster.parse import cluster_from_doc, load_cluster
from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.modelspec import from_zoo
from autopar.search import SearchOptions, search


def one_node(memory_gib: float, ecc: bool | None, count: int = 4):
    g = {"name": "g", "memory_gib": memory_gib, "tflops": 65, "hbm_gbps": 320, "pcie_gbps": 16}
    if ecc is not None:
        g["gddr_ecc"] = ecc
    return cluster_from_doc({"nodes": [{"gpu": g, "count": count}]}, None, standalone=True)


@pytest.mark.parametrize("name", ["T4", "A10", "L4", "A40", "L40", "L40S"])
def test_data_center_gddr_parts_ship_with_ecc_on(name):
    g = gpu(name)
    assert g.gddr_ecc
    assert g.memory_bytes == pytest.approx(g.memory_gib * GIB * 15 / 16)
    assert g.hbm_bw == pytest.approx(g.hbm_gbps * 1e9 * 0.8)
    assert "ECC" in describe_gpu(name)


@pytest.mark.parametrize("name", ["A100-80G", "H100", "A6000", "RTX4090", "V100-16G"])
def test_hbm_and_workstation_parts_keep_their_whole_memory(name):
    g = gpu(name)
    assert not g.gddr_ecc and g.memory_bytes == g.memory_gib * GIB and g.hbm_bw == g.hbm_gbps * 1e9


def test_a_t4_plan_is_budgeted_15_gib_and_its_memory_bound_kernels_run_slower():
    model, ecc = from_zoo("bert-large"), load_cluster("1x4xT4")
    doc = ecc.to_dict()
    doc["nodes"][0]["gpu"].pop("gddr_ecc")
    plain = cluster_from_doc(doc, None, standalone=True)
    plan = search(model, plain, 64, SearchOptions(), with_baselines=False).plan
    with_ecc, without = estimate_plan(replace(plan, cluster=ecc), model), estimate_plan(plan, model)
    assert set(with_ecc.budget_gib.values()) == {16 * ECC_MEMORY_FRACTION} and set(without.budget_gib.values()) == {16}
    assert with_ecc.step_time_s > without.step_time_s  # act_traffic at 256 GB/s, not 320


def test_a_plan_between_the_usable_and_the_datasheet_memory_does_not_fit():
    model = from_zoo("bert-large")
    plan = search(model, one_node(16, None), 64, SearchOptions(), with_baselines=False).plan
    peak = max(estimate_plan(plan, model).memory_gib.values())
    between = peak / (0.5 + 0.5 * ECC_MEMORY_FRACTION)  # datasheet above the peak, 15/16 of it below
    assert estimate_plan(replace(plan, cluster=one_node(between, False)), model).fits
    assert not estimate_plan(replace(plan, cluster=one_node(between, True)), model).fits
    found = search(model, one_node(between, True), 64, SearchOptions(), with_baselines=False)
    assert max(estimate_plan(found.plan, model).memory_gib.values()) <= between * ECC_MEMORY_FRACTION + 1e-9


def test_the_plan_keeps_the_flag_and_reads_it_back():
    cluster = load_cluster("1x4xT4")
    doc = cluster.to_dict()
    assert doc["nodes"][0]["gpu"]["gddr_ecc"] is True
    assert cluster_from_doc(doc, None, standalone=True).nodes[0].gpu == cluster.nodes[0].gpu
    assert "gddr_ecc" not in load_cluster("1x8xA100").to_dict()["nodes"][0]["gpu"]  # the default is not written
    assert ECC_BANDWIDTH_FRACTION == 0.8


def test_a_bad_flag_is_one_line_naming_the_field():
    with pytest.raises(AutoparError, match="gddr_ecc"):
        one_node(16, "sometimes")  # type: ignore[arg-type]
