"""A power-capped GPU's sustained fraction: compute time runs at it, MFU stays against the datasheet."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.cluster.parse import cluster_from_doc, load_cluster
from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.modelspec import from_zoo
from autopar.search import SearchOptions, search


def test_t4_sustains_its_power_capped_clock_and_the_rest_their_datasheet():
    t4 = load_cluster("1x4xT4").nodes[0].gpu
    assert t4.sustained == 0.37 and t4.sustained_flops == pytest.approx(0.37 * t4.flops)
    assert load_cluster("1x8xA100").nodes[0].gpu.sustained == 1.0


def test_compute_runs_at_the_sustained_peak_and_mfu_is_against_the_datasheet():
    model, cluster = from_zoo("bert-large"), load_cluster("1x4xT4")
    plan = search(model, cluster, 8, SearchOptions(), with_baselines=False).plan
    full = replace(plan, cluster=cluster_from_doc({"nodes": [{"gpu": {**cluster.to_dict()["nodes"][0]["gpu"],
                                                                       "sustained": 1.0}, "count": 4}]},
                                                  None, standalone=True))
    capped, uncapped = estimate_plan(plan, model), estimate_plan(full, model)
    # The GEMMs run at 37% of the datasheet peak; the step's collectives and memory-bound kernels keep their time.
    assert capped.step_time_s > 1.15 * uncapped.step_time_s
    # MFU = model FLOPs / (time x datasheet peak): the same peak for both, so it scales with 1 / time
    assert capped.mfu / uncapped.mfu == pytest.approx(uncapped.step_time_s / capped.step_time_s, rel=1e-9)


def test_the_plan_keeps_the_fraction_and_reads_it_back():
    cluster = load_cluster("1x4xT4")
    doc = cluster.to_dict()
    assert doc["nodes"][0]["gpu"]["sustained"] == 0.37
    assert cluster_from_doc(doc, None, standalone=True).nodes[0].gpu == cluster.nodes[0].gpu
    assert "sustained" not in load_cluster("1x8xA100").to_dict()["nodes"][0]["gpu"]  # the default is not written


@pytest.mark.parametrize("value,problem", [(0, "must be > 0"), (1.5, r"must be in \(0, 1\]"), ("x", "number")])
def test_a_bad_fraction_is_one_line_naming_the_field(value, problem):
    doc = {"nodes": [{"gpu": {"name": "g", "memory_gib": 16, "tflops": 65, "hbm_gbps": 320, "sustained": value},
                      "count": 2}]}
    with pytest.raises(AutoparError, match=f"sustained.*{problem}"):
        cluster_from_doc(doc, None, standalone=True)
