"""``autopar calibrate`` end to end, and a calibration used as ``--profile``: the search's number, the
plan's, ``autopar estimate``'s and the library's estimate of the loaded plan are one number."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from autopar.cli import main
from autopar.estimate import estimate_plan
from autopar.planned import load_planned
from autopar.profile import load_profile
from tests.calibrate.synthetic import TRUE, write_measured


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    d = tmp_path_factory.mktemp("cal")
    out = d / "calibration.yaml"
    assert main(["calibrate", str(write_measured(d / "m.yaml")), "--fit", "eff_max,layer_overhead_s,overlap_sync",
                 "-o", str(out), "--json"]) == 0
    return out


def test_calibrate_writes_a_calibration_with_its_cross_validation(calibration, capsys):
    doc = yaml.safe_load(calibration.read_text())
    assert doc["format"] == "autopar-calibration/1" and doc["gpus"] == ["A100-80G"]
    for name, want in TRUE.items():
        assert doc["cost_params"][name] == pytest.approx(want, rel=0.02)
    assert doc["cv"]["method"] == "5-fold" and len(doc["runs"]["used"]) == 14
    assert doc["figures"]["cv"]["mape"] < 0.02 and doc["figures"]["default"]["mape"] > 0.2
    assert sorted(i for f in doc["cv"]["folds"] for i in f["held_out"]) == sorted(r["id"] for r in doc["runs"]["used"])
    assert load_profile(calibration).kind == "calibration"


def test_calibrate_prints_its_figures(tmp_path, capsys):
    assert main(["calibrate", str(write_measured(tmp_path / "m.yaml")), "--cases", "syn-00,syn-03,syn-07,syn-10",
                 "--fit", "eff_max", "-o", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    assert "calibrated on 4 run(s) of A100-80G" in out and "held out (leave-one-out)" in out
    assert out.rstrip().endswith(f"wrote {tmp_path / 'c.yaml'}")


def _search(tmp_path, calibration, capsys, *extra) -> tuple[str, dict]:
    path = tmp_path / "plan.yaml"
    assert main(["search", "--model", "gpt3-1.3b", "--cluster", "2x4xA100-80G", "--global-batch-size", "16",
                 "--seq-len", "512", "--no-baselines", "--profile", str(calibration), "-o", str(path), "--json",
                 *extra]) == 0
    return str(path), json.loads(capsys.readouterr().out)["predicted"]


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_search_estimate_validate_with_a_calibration_agree(calibration, tmp_path, capsys, precision):
    """A calibration replaces cost parameters only, so it goes with any precision (a machine profile does not)."""
    path, searched = _search(tmp_path, calibration, capsys, "--precision", precision)
    planned = load_planned(path)
    assert planned.plan.precision == precision
    assert planned.params.eff_max == pytest.approx(TRUE["eff_max"], rel=0.02)
    assert planned.plan.search["profile"]["kind"] == "calibration"
    lib = estimate_plan(*planned).predicted()
    for extra in ([], ["--profile", str(calibration)]):
        assert main(["estimate", path, "--json", *extra]) == 0
        cli = json.loads(capsys.readouterr().out)["predicted"]
        for key in ("step_time_s", "tokens_per_s", "mfu", "max_memory_gib"):
            assert math.isclose(lib[key], searched[key], rel_tol=1e-12), key
            assert math.isclose(cli[key], searched[key], rel_tol=1e-12), key
    assert main(["validate", path]) == 0
    assert "valid" in capsys.readouterr().out
    rebased = load_planned(path, profile=calibration)
    assert estimate_plan(*rebased).step_time_s == pytest.approx(searched["step_time_s"], rel=1e-12)


def test_a_calibration_that_is_gone_leaves_a_note(calibration, tmp_path, capsys):
    path, _ = _search(tmp_path, calibration, capsys)
    doc = yaml.safe_load(open(path))
    doc["search"]["profile"]["path"] = str(tmp_path / "gone.yaml")
    open(path, "w").write(yaml.safe_dump(doc))
    assert main(["validate", path]) == 0
    assert "calibration" in capsys.readouterr().out.splitlines()[1]


def test_calibrate_json_is_one_object_with_the_figures(tmp_path, capsys):
    doc = yaml.safe_load(open(write_measured(tmp_path / "m.yaml")))
    doc["cases"][0].update(status="failed", measured_s=None)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    assert main(["calibrate", str(tmp_path / "m.yaml"), "--folds", "3", "-o", str(tmp_path / "c.yaml"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["used"] == 13 and [s["id"] for s in got["skipped"]] == ["syn-00"]
    assert set(got["figures"]) == {"default", "in_sample", "cv"} and set(got["cost_params"]) == {"eff_max",
                                                                                                  "layer_overhead_s"}
    assert yaml.safe_load((tmp_path / "c.yaml").read_text())["cv"]["method"] == "3-fold"
