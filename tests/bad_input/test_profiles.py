"""Profiles: malformed files (every section, the cost parameters field by field), profiles that do not
match the model or cluster, and profiled plans whose stored cost parameters or profile record were
edited. Each is refused in one line; a profile other than the recorded one is named on stderr."""

from __future__ import annotations

import pytest
import yaml

from autopar.cli import main
from tests.bad_input.harness import check_refused, copy, deleter, edited, setter, write

CP = "cost_params"
PROFILE_EDITS = {
    "version-99": setter("autopar_profile", 99),
    "version-missing": deleter("autopar_profile"),
    "device-missing": deleter("device"),
    "device-nproc-zero": setter("device.nproc", 0),
    "model-seq-len-zero": setter("model.seq_len", 0),
    "model-units-a-string": setter("model.units", "all"),
    "compute-missing": deleter("compute"),
    "compute-peak-zero": setter("compute.peak_tflops", 0),
    "compute-peak-nan": setter("compute.peak_tflops", float("nan")),
    "compute-peak-inf": setter("compute.peak_tflops", float("inf")),
    "compute-hbm-negative": setter("compute.hbm_gbps", -1),
    "fits-alpha-negative": lambda doc: doc["communication"]["fits"][2]["allreduce"].update(alpha_s=-1.0),
    "fits-beta-a-word": lambda doc: doc["communication"]["fits"][2]["allgather"].update(beta_s_per_byte="fast"),
    "fits-group-one": lambda doc: doc["communication"]["fits"].update({1: doc["communication"]["fits"][2]}),
    "link-bw-zero": setter("communication.link.bw_gbps", 0),
    "state-table-row-missing": deleter("memory.state_table.zero3"),
    "unit-missing": lambda doc: doc["memory"]["units"].pop(doc["model"]["units"][0]),
    "unit-negative-bytes": lambda doc: doc["memory"]["units"][doc["model"]["units"][1]].update(act_tp_bytes=-5),
    "cost-params-missing": deleter(CP),
    "cost-params-a-list": setter(CP, [1]),
    "cost-eff-max-negative": setter(f"{CP}.eff_max", -0.3),
    "cost-eff-max-absurd": setter(f"{CP}.eff_max", 50.0),
    "cost-overhead-negative": setter(f"{CP}.layer_overhead_s", -1e-3),
    "cost-param-bytes-zero": setter(f"{CP}.param_bytes", 0),
    "cost-state-bytes-a-word": setter(f"{CP}.state_bytes", "sixteen"),
    "cost-opt-bytes-negative": setter(f"{CP}.opt_bytes_touched", -1),
    "cost-overlap-above-one": setter(f"{CP}.overlap_sync", 1.5),
    "cost-reserve-negative": setter(f"{CP}.reserve_gib", -100),
    "cost-unknown-field": setter(f"{CP}.turbo", 1),
    "cost-eff-by-kind-short-row": setter(f"{CP}.eff_by_kind", [["block", 1, 0]]),
    "cost-eff-by-kind-zero-7": setter(f"{CP}.eff_by_kind", [["block", 1, 7, 0.5, 0.0]]),
    "cost-comm-fit-unknown": setter(f"{CP}.comm_fit", [["alltoall", 2, 0.0, 0.0]]),
    "cost-comm-fit-beta-negative": setter(f"{CP}.comm_fit", [["allreduce", 2, 0.0, -1e-9]]),
    "cost-state-table-two-rows": setter(f"{CP}.state_table", [[16, 0], [4, 16]]),
    "cost-step-overhead-inf": setter(f"{CP}.step_overhead_per_unit_s", float("inf")),
}


def _profile(d, s, edit) -> str:
    return edited(d, s.profile_doc, edit, "profile.yaml")


RAW = {"empty": "", "not-yaml": "autopar_profile: [1\n", "a-list": "- 1\n", "a-number": "42\n"}
PPLAN_EDITS = {  # a profiled plan, validated with its profile at its recorded path
    "cost-eff-max-changed": setter("search.cost_params.eff_max", 0.5),
    "cost-reserve-changed": setter("search.cost_params.reserve_gib", 3.0),
    "cost-comm-fit-dropped": setter("search.cost_params.comm_fit", []),
    "cost-state-table-defaulted": setter("search.cost_params.state_table", []),
    "cost-opt-bytes-changed": setter("search.cost_params.opt_bytes_touched", 36),
    "cost-param-bytes-changed": setter("search.cost_params.param_bytes", 2),
    "record-removed": deleter("search.profile"),
    "record-a-list": setter("search.profile", [1]),
    "record-seq-len": setter("search.profile.model.seq_len", 4096),
    "record-units-renamed": setter("search.profile.model.units", ["a", "b"]),
    "record-unit-boundary": lambda doc: [u.update(boundary_bytes=1e12) for u in doc["search"]["profile"]["units"].values()],
    "record-unit-activations": lambda doc: [u.update(act_tp_bytes=1.0)
                                            for u in doc["search"]["profile"]["units"].values()],
    "record-sha-and-cost": lambda doc: (doc["search"]["profile"].update(sha256="0" * 64),
                                        doc["search"]["cost_params"].update(reserve_gib=0.0)),
    "cluster-peak": setter("cluster.gpus.cpu.tflops", 50.0),
    "cluster-memory-raised": setter("cluster.gpus.cpu.memory_gib", 800.0),
    "cluster-memory-raised-profile-gone": lambda doc: (doc["cluster"]["gpus"]["cpu"].update(memory_gib=800.0),
                                                       doc["search"]["profile"].update(path="/nonexistent.yaml")),
    "predicted-step": lambda doc: doc["predicted"].update(step_time_s=doc["predicted"]["step_time_s"] / 3),
}
MISMATCHED = {
    "search-other-model": lambda d, s: ["search", "--model", "gpt3-1.3b", "--cluster", "1x2xcpu",
                                        "--global-batch-size", "8", "--profile", s.profile, "-o", "OUT"],
    "search-bigger-groups": lambda d, s: ["search", "--model", "gpt-tiny", "--cluster", "1x4xcpu",
                                          "--global-batch-size", "8", "--profile", s.profile, "-o", "OUT"],
    "search-other-device": lambda d, s: ["search", "--model", "gpt-tiny", "--cluster", "1x2xA100-80G",
                                         "--global-batch-size", "8", "--profile", s.profile, "-o", "OUT"],
    "estimate-other-device": lambda d, s: ["estimate", edited(d, s.plan, lambda doc: None), "--profile", s.profile],
    "estimate-profile-is-a-directory": lambda d, s: ["estimate", edited(d, s.pplan, lambda doc: None), "--profile",
                                                     str(d / "in")],
}


@pytest.mark.parametrize("case", sorted(PROFILE_EDITS))
def test_malformed_profile_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: ["estimate", edited(d, s.pplan, lambda doc: None), "--profile",
                                _profile(d, s, PROFILE_EDITS[case])], docs, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", sorted(RAW))
def test_unreadable_profile_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: ["search", "--model", "gpt-tiny", "--cluster", "1x2xcpu", "--global-batch-size", "8",
                                "--profile", write(d, "p.yaml", RAW[case]), "-o", "OUT"], docs, tmp_path, capsys,
                  monkeypatch)


@pytest.mark.parametrize("case", sorted(PPLAN_EDITS))
def test_tampered_profiled_plan_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: ["validate", edited(d, s.pplan, PPLAN_EDITS[case])], docs, tmp_path, capsys,
                  monkeypatch)


@pytest.mark.parametrize("case", sorted(MISMATCHED))
def test_mismatched_profile_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(MISMATCHED[case], docs, tmp_path, capsys, monkeypatch)


def test_profiled_plan_without_its_profile_says_so(docs, tmp_path, capsys):
    doc = copy(docs.pplan)
    doc["search"]["profile"]["path"] = str(tmp_path / "gone.yaml")
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("recomputed from the model)") and "checked for range only" in out[1]


def test_another_profile_than_the_recorded_one_is_named_on_stderr(docs, tmp_path, capsys):
    other = tmp_path / "other.yaml"
    other.write_text(open(docs.profile).read() + "\n# another run\n")  # same numbers, another file
    plan = tmp_path / "p.yaml"
    plan.write_text(yaml.safe_dump(docs.pplan))
    assert main(["estimate", str(plan), "--profile", str(other), "--json"]) == 0
    got = capsys.readouterr()
    assert "predicted" in got.out
    assert len(got.err.splitlines()) == 1 and "was searched with profile" in got.err and str(other) in got.err
