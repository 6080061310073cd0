"""Bad measured files: one-line AutoparError naming the case id and the field."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError
from autopar.measured import load_runs

from .measured_testlib import write


def _error(tmp_path, edit, strict=False) -> str:
    with pytest.raises(AutoparError) as info:
        load_runs(write(tmp_path, edit), strict=strict)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_missing_field(tmp_path):
    msg = _error(tmp_path, lambda d: d["cases"][0].pop("pp"))
    assert msg.startswith("tiny.yaml:case pp2.pp: is missing")


def test_non_positive_time(tmp_path):
    def edit(doc):
        doc["cases"][1]["measured_s"] = 0

    assert _error(tmp_path, edit).startswith("tiny.yaml:case tp2-even.measured_s: must be > 0")


def test_layers_per_stage_not_matching_the_model(tmp_path):
    def edit(doc):
        doc["cases"][0]["layers_per_stage"] = [3, 2]

    msg = _error(tmp_path, edit)
    assert msg.startswith("tiny.yaml:case pp2.layers_per_stage: [3, 2] (2 stages, 5 units) does not match")


def test_batch_that_does_not_add_up(tmp_path):
    def edit(doc):
        doc["cases"][0]["num_microbatches"] = 3

    assert _error(tmp_path, edit).startswith("tiny.yaml:case pp2.global_batch_size: is 16 but")


def test_unknown_gpu_is_skipped_or_raised_when_strict(tmp_path):
    def edit(doc):
        doc["cluster"]["nodes"][0]["gpu"] = "Gaudi 3 (900 W)"

    rs = load_runs(write(tmp_path, edit))
    assert rs.runs == [] and rs.failed == []
    assert rs.skip_counts() == {"unknown GPU": 3, "inexpressible": 1, "unpublished": 1}
    detail = next(s.detail for s in rs.skipped if s.case_id == "pp2")
    assert detail.startswith("tiny.yaml:case pp2 cluster.nodes[0].gpu: unknown GPU type 'Gaudi 3 (900 W)'")
    assert _error(tmp_path, edit, strict=True).startswith("tiny.yaml:case pp2 cluster.nodes[0].gpu: unknown GPU")


def test_plan_the_rules_refuse(tmp_path):
    def edit(doc):  # 4 heads: tp 8 does not divide them
        doc["cluster"]["nodes"][0]["count"] = 8
        doc["cases"] = [{"id": "tp8", "pp": 1, "tp": 8, "dp": 1, "micro_batch_size": 16, "num_microbatches": 1,
                         "zero": 0, "ckpt": "none", "layers_per_stage": [6], "measured_s": 1.0}]

    rs = load_runs(write(tmp_path, edit))
    assert [(s.case_id, s.reason) for s in rs.skipped] == [("tp8", "refused")]
    assert "tp" in rs.skipped[0].detail
    assert _error(tmp_path, edit, strict=True).startswith("tiny.yaml:case tp8: the plan rules refuse the plan")


def test_wrong_format_and_duplicate_ids(tmp_path):
    assert _error(tmp_path, lambda d: d.update(format="other/1")).startswith("tiny.yaml:format: unknown format")

    def dup(doc):
        doc["cases"][1]["id"] = "pp2"

    assert _error(tmp_path, dup).startswith("tiny.yaml:cases[1].id: duplicate case id 'pp2'")


def test_failed_case_with_a_time(tmp_path):
    def edit(doc):
        doc["cases"][2]["measured_s"] = 1.0

    assert _error(tmp_path, edit).startswith("tiny.yaml:case oom.measured_s: is set on a failed case")
