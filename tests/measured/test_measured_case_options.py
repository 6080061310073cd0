"""A case's ``zero_overlap`` and its own ``cluster`` block: read onto the plan, refused where they cannot hold."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.measured import load_runs

from .measured_testlib import write


def _by_id(rs):
    return {r.case_id: r for r in rs.runs + rs.failed}


def test_zero_overlap_reaches_every_unit_and_hides_the_step_traffic(tmp_path):
    def edit(doc):
        doc["cases"][1]["zero_overlap"] = True  # tp2-even: zero 1

    plain = _by_id(load_runs(write(tmp_path, name="plain.yaml")))["tp2-even"]
    run = _by_id(load_runs(write(tmp_path, edit)))["tp2-even"]
    layers = [ly for st in run.plan.pipelines[0].stages for ly in st.layers]
    assert layers and all(ly.strategy.zero_overlap for ly in layers)
    assert not any(ly.strategy.zero_overlap for st in plain.plan.pipelines[0].stages for ly in st.layers)
    assert estimate_plan(run.plan, run.model).step_time_s < estimate_plan(plain.plan, plain.model).step_time_s


@pytest.mark.parametrize("zero", [0, 3])
def test_zero_overlap_without_a_distributed_optimizer_is_one_line_naming_the_field(tmp_path, zero):
    def edit(doc):
        doc["cases"][1].update(zero=zero, zero_overlap=True)

    with pytest.raises(AutoparError, match=r"case tp2-even\.zero_overlap: is true with zero \d.*give zero 1 or 2"):
        load_runs(write(tmp_path, edit))


def test_a_case_with_its_own_cluster_runs_there(tmp_path):
    def edit(doc):
        doc["cases"][1]["cluster"] = {"nodes": [{"gpu": "H100", "count": 4, "repeat": None, "intra_bw_gbps": None}],
                                      "inter_bw_gbps": None}

    got = _by_id(load_runs(write(tmp_path, edit)))
    assert got["tp2-even"].plan.cluster.gpu_of(0).name == "H100-SXM"
    assert got["pp2"].plan.cluster.gpu_of(0).name == "A100-80G"  # the others keep the file's
    assert "H100" in got["tp2-even"].group and "A100" in got["pp2"].group


def test_runs_of_another_software_release_form_their_own_group(tmp_path):
    """The same layout measured in two releases (Megatron-Bridge's containers) is not ranked against itself."""
    def edit(doc):
        doc["cases"][0]["container"] = "NeMo 25.09"

    got = _by_id(load_runs(write(tmp_path, edit)))
    plain = _by_id(load_runs(write(tmp_path, name="plain.yaml")))
    assert got["pp2"].group == plain["pp2"].group + " (NeMo 25.09)"
    assert got["tp2-even"].group == plain["tp2-even"].group


def test_a_bad_case_cluster_names_the_case_field(tmp_path):
    def edit(doc):
        doc["cases"][1]["cluster"] = {"nodes": [{"gpu": "H999", "count": 4, "repeat": None, "intra_bw_gbps": None}],
                                      "inter_bw_gbps": None}

    with pytest.raises(AutoparError, match=r"case tp2-even\.cluster\.nodes\[0\]\.gpu: unknown GPU type 'H999'"):
        load_runs(write(tmp_path, edit), strict=True)
    skipped = {s.case_id: s.reason for s in load_runs(write(tmp_path, edit)).skipped}
    assert skipped["tp2-even"] == "unknown GPU"  # counted and named, not dropped
