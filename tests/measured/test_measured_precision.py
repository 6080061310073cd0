"""Measured files state their precision (``precision_mode``), and the plans are estimated at it."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.measured import load_runs

from .measured_testlib import write


def _h100(doc):
    doc["cluster"]["nodes"][0]["gpu"] = "H100"


def test_file_precision_mode_sets_every_case(tmp_path):
    def edit(doc):
        _h100(doc)
        doc["model"]["precision_mode"] = "fp32"

    rs = load_runs(write(tmp_path, edit))
    assert not rs.notes
    for run in rs.runs + rs.failed:
        assert run.plan.precision == "fp32" and run.model.dtype_bytes == 4
        assert run.plan.search["cost_params"]["param_bytes"] == 4
        assert not any("precision" in n for n in run.notes)


def test_a_case_overrides_the_file_and_fp8_runs_faster(tmp_path):
    def edit(doc):
        _h100(doc)
        doc["cases"][0].update(precision_mode="fp8", float8=True)

    rs = load_runs(write(tmp_path, edit))
    fp8, other = rs.runs
    assert (fp8.plan.precision, other.plan.precision) == ("fp8", "fp16")  # fp16: the file's free text
    assert fp8.plan.cluster.nodes[0].gpu.flops == 1979e12
    edit_bf16 = load_runs(write(tmp_path, _h100)).runs[0]
    assert estimate_plan(fp8.plan, fp8.model).step_time_s < estimate_plan(edit_bf16.plan, edit_bf16.model).step_time_s


@pytest.mark.parametrize("recipe, noted", [("tensorwise", False), ("rowwise", True)])
def test_a_float8_recipe_the_fp8_row_does_not_price_is_noted(tmp_path, recipe, noted):
    def edit(doc):
        _h100(doc)
        doc["cases"][0].update(precision_mode="fp8", float8=True, float8_recipe=recipe)

    run = load_runs(write(tmp_path, edit)).runs[0]
    assert run.plan.precision == "fp8"
    assert any(f"float8_recipe {recipe}: not modelled" in n for n in run.notes) is noted


def test_free_text_without_a_precision_word_defaults_to_bf16_with_a_note(tmp_path):
    def edit(doc):
        doc["model"]["precision"] = "half precision: not stated"
        doc["cases"][0]["precision"] = "mixed, see the log"

    rs = load_runs(write(tmp_path, edit))
    assert rs.notes == ["precision not modelled: half precision: not stated (bf16 assumed)"]
    pp2 = next(r for r in rs.runs if r.case_id == "pp2")
    assert "precision not modelled: mixed, see the log (bf16 assumed)" in pp2.notes
    assert pp2.plan.precision == "bf16"


@pytest.mark.parametrize("edit, start", [
    (lambda d: d["model"].update(precision_mode="fp64"), "tiny.yaml:model.precision_mode: unknown precision_mode"),
    (lambda d: d["cases"][0].update(float8=True), "tiny.yaml:case pp2.precision_mode: is fp16 but the case has "
                                                  "float8: true"),
    (lambda d: d["cases"][0].update(precision_mode="fp8"), "tiny.yaml:case pp2.precision_mode: gpu A100-80G.tflops_fp8: "
                                                           "is not known (0)"),
    (lambda d: d["cases"][0].update(float8_recipe="rowwise"), "tiny.yaml:case pp2.float8_recipe: is set but the case "
                                                              "is fp16"),
    (lambda d: d["cases"][0].update(precision_mode="fp8", float8_recipe="blockwise"),
     "tiny.yaml:case pp2.float8_recipe"),
])
def test_bad_precision_is_one_line(tmp_path, edit, start):
    with pytest.raises(AutoparError) as info:
        load_runs(write(tmp_path, edit))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(start), str(info.value)
