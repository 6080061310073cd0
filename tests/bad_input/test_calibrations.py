"""Calibration: bad runs (measured files and plan lists: missing fields, unknown GPUs, times that are not
positive, plans that do not match their model), fields the runs cannot identify, malformed calibration
files given as --profile, and tampered calibrated plans. Each is refused in one line, nothing written."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from autopar.cli import main
from tests.bad_input.harness import check_refused, deleter, edited, setter, write
from tests.calibrate.synthetic import measured_doc, write_measured


@pytest.fixture(scope="module")
def cal(tmp_path_factory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("cal_docs")
    measured = write_measured(d / "m.yaml")
    assert main(["calibrate", str(measured), "-o", str(d / "cal.yaml"), "--json"]) == 0
    assert main(["search", "--model", "gpt3-1.3b", "--cluster", "2x4xA100-80G", "--global-batch-size", "16",
                 "--seq-len", "512", "--no-baselines", "--profile", str(d / "cal.yaml"), "-o", str(d / "cplan.yaml"),
                 "--json"]) == 0
    return SimpleNamespace(measured=yaml.safe_load(measured.read_text()), path=str(d / "cal.yaml"),
                           doc=yaml.safe_load((d / "cal.yaml").read_text()),
                           cplan=yaml.safe_load((d / "cplan.yaml").read_text()))


def _calibrate(*extra):
    return ["calibrate", *extra, "-o", "OUT"]


CASE0 = "cases.0"
MEASURED_EDITS = {  # an autopar-measured/1 file
    "measured-s-missing": deleter(f"{CASE0}.measured_s"),
    "measured-s-zero": setter(f"{CASE0}.measured_s", 0),
    "measured-s-negative": setter(f"{CASE0}.measured_s", -1.5),
    "measured-s-a-word": setter(f"{CASE0}.measured_s", "fast"),
    "pp-missing": deleter(f"{CASE0}.pp"),
    "unknown-gpu": setter("cluster.nodes.0.gpu", "Z9000"),
    "tp-spans-nodes": lambda doc: doc["cases"][0].update(tp=8, dp=1, micro_batch_size=4, num_microbatches=8),
    "batch-mismatch": setter(f"{CASE0}.num_microbatches", 3),
    "format-other": setter("format", "autopar-measured/9"),
    "cases-empty": setter("cases", []),
}


@pytest.mark.parametrize("case", sorted(MEASURED_EDITS))
def test_bad_measured_runs_are_refused(case, docs, cal, tmp_path, capsys, monkeypatch):
    line = check_refused(lambda d, s: _calibrate(edited(d, cal.measured, MEASURED_EDITS[case])), docs, tmp_path,
                         capsys, monkeypatch)
    if case.startswith(("measured-s", "pp", "unknown", "tp-spans")):
        assert "syn-00" in line, line


def _runs(d, s, runs) -> str:
    write(d, "plan.yaml", yaml.safe_dump(s.plan))
    write(d, "pplan.yaml", yaml.safe_dump(s.pplan))
    other = dict(s.plan, model={**s.plan["model"], "source": "gpt3-13b", "name": "gpt3-13b"})
    write(d, "other.yaml", yaml.safe_dump(other))
    return write(d, "runs.yaml", yaml.safe_dump({"format": "autopar-runs/1", "runs": runs}))


GOOD = {"plan": "plan.yaml", "measured_s": 2.0}
RUNS = {  # an autopar-runs/1 file: a list of {plan, measured_s}
    "measured-s-missing": [{"plan": "plan.yaml"}, GOOD],
    "measured-s-zero": [{"plan": "plan.yaml", "measured_s": 0}, GOOD],
    "measured-s-inf": [{"plan": "plan.yaml", "measured_s": float("inf")}, GOOD],
    "plan-missing": [{"measured_s": 1.0}, GOOD],
    "plan-not-there": [{"plan": "gone.yaml", "measured_s": 1.0}, GOOD],
    "plan-of-another-model": [{"plan": "other.yaml", "measured_s": 1.0}, GOOD],
    "plan-searched-with-a-profile": [{"plan": "pplan.yaml", "measured_s": 1.0}, GOOD],
    "unknown-key": [{"plan": "plan.yaml", "measured_s": 1.0, "turbo": 1}, GOOD],
    "runs-empty": [],
    "one-run": [GOOD],
}


@pytest.mark.parametrize("case", sorted(RUNS))
def test_bad_plan_runs_are_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: _calibrate(_runs(d, s, RUNS[case])), docs, tmp_path, capsys, monkeypatch)


COMMANDS = {  # what is asked of good runs
    "fit-unknown": lambda d, c: _calibrate(_m(d, c), "--fit", "turbo"),
    "fit-zero3-without-zero3-runs": lambda d, c: _calibrate(_m(d, c, plain=True), "--fit", "eff_max,overlap_zero3"),
    "fit-collinear": lambda d, c: _calibrate(_m(d, c, twins=True), "--cases", "syn-00,syn-99"),
    "cases-unknown": lambda d, c: _calibrate(_m(d, c), "--cases", "syn-00,nope"),
    "group-unknown": lambda d, c: _calibrate(_m(d, c), "--group", "nope"),
    "folds-one": lambda d, c: _calibrate(_m(d, c), "--folds", "1"),
    "no-runs-given": lambda d, c: ["calibrate", "-o", "OUT"],
    "runs-not-yaml": lambda d, c: _calibrate(write(d, "r.yaml", "format: [1\n")),
    "runs-other-format": lambda d, c: _calibrate(write(d, "r.yaml", "format: autopar-runs/7\nruns: []\n")),
    "runs-a-directory": lambda d, c: _calibrate(str(d / "in")),
}


def _m(d, c, plain: bool = False, twins: bool = False) -> str:
    doc = measured_doc()
    doc["cases"] = [dict(x, measured_s=1.0 + i / 10) for i, x in enumerate(doc["cases"]) if not plain or x["zero"] != 3]
    if twins:
        doc["cases"].append(dict(doc["cases"][0], id="syn-99", measured_s=2.0))
    return write(d, "m.yaml", yaml.safe_dump(doc))


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_bad_calibrate_commands_are_refused(case, docs, cal, tmp_path, capsys, monkeypatch):
    line = check_refused(lambda d, s: COMMANDS[case](d, cal), docs, tmp_path, capsys, monkeypatch)
    if case == "fit-zero3-without-zero3-runs":
        assert "overlap_zero3" in line and "zero: 3" in line, line
    if case == "fit-collinear":
        assert "eff_max,layer_overhead_s" in line, line


CP = "cost_params"
CALIBRATION_EDITS = {  # a calibration given as --profile
    "format-other": setter("format", "autopar-calibration/7"),
    "gpus-missing": deleter("gpus"),
    "gpus-empty": setter("gpus", []),
    "gpus-a-number": setter("gpus", [7]),
    "cost-params-missing": deleter(CP),
    "cost-params-empty": setter(CP, {}),
    "cost-eff-max-negative": setter(f"{CP}.eff_max", -0.2),
    "cost-overhead-inf": setter(f"{CP}.layer_overhead_s", float("inf")),
    "cost-unknown-field": setter(f"{CP}.turbo", 1.0),
    "fitted-on-other-gpus": setter("gpus", ["V100-32G"]),
    # the measured links of autopar calibrate --nccl-tests
    "communication-a-list": setter("communication", [1]),
    "communication-inter-bw-zero": setter("communication", {"inter_link": {"bw_gbps": 0, "lat_us": 5}}),
    "communication-link-lat-negative": setter("communication", {"link": {"bw_gbps": 10, "lat_us": -1}}),
    "communication-link-bw-missing": setter("communication", {"link": {"lat_us": 1}}),
    "communication-empty-and-cost-params-empty": lambda doc: doc.update(cost_params={}, communication={}),
}


@pytest.mark.parametrize("case", sorted(CALIBRATION_EDITS))
def test_bad_calibration_profile_is_refused(case, docs, cal, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: ["estimate", edited(d, s.plan, lambda doc: None), "--profile",
                                edited(d, cal.doc, CALIBRATION_EDITS[case], "c.yaml")], docs, tmp_path, capsys,
                  monkeypatch)


def test_search_with_a_calibration_of_other_gpus_is_refused(docs, cal, tmp_path, capsys, monkeypatch):
    line = check_refused(lambda d, s: ["search", "--model", "gpt-tiny", "--cluster", "2xcpu", "--global-batch-size",
                                       "8", "--profile", cal.path, "-o", "OUT"], docs, tmp_path, capsys, monkeypatch)
    assert "calibration.gpus" in line and "cpu" in line, line


CPLAN_EDITS = {  # a plan searched with a calibration, validated with it at its recorded path
    "cost-eff-max-changed": setter("search.cost_params.eff_max", 0.6),
    "cost-overhead-defaulted": setter("search.cost_params.layer_overhead_s", 5e-5),
    "record-removed": deleter("search.profile"),
    "record-sha-and-cost": lambda doc: (doc["search"]["profile"].update(sha256="0" * 64),
                                        doc["search"]["cost_params"].update(eff_max=0.6)),
    "predicted-step": lambda doc: doc["predicted"].update(step_time_s=doc["predicted"]["step_time_s"] / 3),
}


@pytest.mark.parametrize("case", sorted(CPLAN_EDITS))
def test_tampered_calibrated_plan_is_refused(case, docs, cal, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: ["validate", edited(d, cal.cplan, CPLAN_EDITS[case])], docs, tmp_path, capsys,
                  monkeypatch)
