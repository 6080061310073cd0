"""Inputs: measured files and plan files with a measured time; selection by case and group; nothing
dropped silently; bad runs named by case and field."""

from __future__ import annotations

import pytest
import yaml

from autopar.calibrate.inputs import load_inputs
from autopar.cli import main
from autopar.errors import AutoparError
from tests.calibrate.synthetic import SHAPES, measured_doc, write_measured


def test_measured_runs_failed_and_skipped_cases_are_all_accounted_for(tmp_path):
    doc = measured_doc()
    doc["cases"][0].update(status="failed", measured_s=None)
    doc["cases"][1].update(status="inexpressible", note="ran something else")
    doc["cases"][2].update(num_microbatches=None, micro_batch_size=None)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    got = load_inputs([str(path)])
    assert len(got.runs) == len(SHAPES) - 3
    assert [(s["id"], s["reason"]) for s in got.skipped] == [("syn-00", "failed"), ("syn-01", "inexpressible"),
                                                             ("syn-02", "unpublished")]
    assert got.gpus == ["A100-80G"]


def test_cases_and_group_select(tmp_path):
    path = str(write_measured(tmp_path / "m.yaml"))
    assert [r.case_id for r in load_inputs([path], cases=["syn-03", "syn-05"]).runs] == ["syn-03", "syn-05"]
    group = load_inputs([path]).runs[0].group
    assert len(load_inputs([path], group=group).runs) == len(SHAPES)
    with pytest.raises(AutoparError, match="no case 'syn-99'"):
        load_inputs([path], cases=["syn-99"])
    with pytest.raises(AutoparError, match="no group 'nope'"):
        load_inputs([path], group="nope")


def test_plan_files_with_measured_times(tmp_path, capsys):
    for name, gbs in (("a", "8"), ("b", "16")):
        assert main(["search", "--model", "gpt-tiny", "--cluster", "2xcpu", "--global-batch-size", gbs,
                     "--no-baselines", "-o", str(tmp_path / f"{name}.yaml"), "--json"]) == 0
    capsys.readouterr()
    runs = tmp_path / "runs.yaml"
    runs.write_text(yaml.safe_dump({"format": "autopar-runs/1", "runs": [{"plan": "a.yaml", "measured_s": 0.5},
                                                                         {"id": "bee", "plan": "b.yaml",
                                                                          "measured_s": 0.9}]}))
    got = load_inputs([str(runs)])
    assert [r.case_id for r in got.runs] == ["a", "bee"] and [r.measured_s for r in got.runs] == [0.5, 0.9]
    assert got.runs[0].group != got.runs[1].group and got.gpus == ["cpu"]


def test_duplicate_ids_across_files_are_refused(tmp_path):
    a = str(write_measured(tmp_path / "a.yaml"))
    with pytest.raises(AutoparError, match="case id 'syn-00' is in both"):
        load_inputs([a, a])
