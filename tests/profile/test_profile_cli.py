"""`autopar profile` end to end (2 fork-started processes), and `--profile` in search and estimate."""

from __future__ import annotations

import json

import pytest
import yaml

from autopar.cli import main
from autopar.profile import load_profile

pytestmark = pytest.mark.dist

SEARCH = ["search", "--model", "gpt-tiny", "--cluster", "2xcpu", "--global-batch-size", "8", "--no-baselines"]


def run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_quick_profile_is_a_complete_versioned_file(tiny_profile):
    p = load_profile(tiny_profile)
    assert p["autopar_profile"] == 1 and p["device"]["type"] == "cpu" and p["device"]["backend"] == "gloo"
    assert p["device"]["nproc"] == 2 and p["torch"] and p["created"] and p["host"]
    assert p["model"]["name"] == "gpt-tiny" and p["model"]["dtype_bytes"] == 4
    assert p.group_sizes == [2]
    units = {s["unit"] for s in p["compute"]["samples"]}
    assert units == set(p["model"]["units"])  # every unit, timed inside whole steps
    assert {s["ckpt"] for s in p["compute"]["samples"] if s["unit"] == "layers.0"} == {"none", "selective", "full"}
    assert all(s["fwd_s"] > 0 and s["bwd_s"] > 0 for s in p["compute"]["samples"])
    assert p["compute"]["fit"]["by_kind"]["block"]["eff_max"] > 0
    # the measured link is priced as measured, and the profile says so where it states its assumptions
    assert p["cost_params"]["link_efficiency"] == 1.0 and "link_efficiency" in p["assumptions"]
    assert "link_efficiency" not in p["compute"]
    for c in ("allreduce", "allgather", "reduce_scatter", "alltoall", "p2p"):
        f = p["communication"]["fits"][2][c]
        assert f["alpha_s"] >= 0 and f["beta_s_per_byte"] >= 0 and f["rel_rms"] >= 0
        assert f["alpha_s"] + f["beta_s_per_byte"] * 2**20 > 0
    assert 0 < p["communication"]["link"]["bw_gbps"] < 1e6
    # the runtime's fp32 AdamW states: 16 B/param replicated, ZeRO-3 shards all 16
    table = p["memory"]["state_table"]
    assert (table["zero0"]["a"], table["zero0"]["b"]) == (16.0, 0.0)
    assert (table["zero3"]["a"], table["zero3"]["b"]) == (0.0, 16.0)
    block = p["memory"]["units"]["layers.0"]
    assert block["measured"]["full"] == 32 * 64 * 4  # full checkpointing keeps the block's input only
    assert block["act_tp_bytes"] > 0 and block["act_seq_bytes"] > 0


def test_search_accepts_the_profile_and_records_it(tiny_profile, tmp_path, capsys):
    plan_path = tmp_path / "plan.yaml"
    rc, out, err = run(SEARCH + ["--profile", str(tiny_profile), "-o", str(plan_path), "--json"], capsys)
    assert rc == 0, err
    doc = yaml.safe_load(plan_path.read_text())
    rec = doc["search"]["profile"]
    assert rec["sha256"] == load_profile(tiny_profile).sha256 and rec["path"] == str(tiny_profile)
    assert rec["model"]["name"] == "gpt-tiny" and set(rec["units"]) == set(rec["model"]["units"])
    prof = load_profile(tiny_profile)
    assert doc["cluster"]["gpus"]["cpu"]["tflops"] == pytest.approx(prof["compute"]["peak_tflops"])
    assert doc["cluster"]["nodes"][0]["intra_bw_gbps"] == pytest.approx(prof["communication"]["link"]["bw_gbps"])
    assert doc["search"]["cost_params"]["comm_fit"] and doc["search"]["cost_params"]["param_bytes"] == 4
    assert doc["search"]["cost_params"]["link_efficiency"] == 1.0  # the measured link is what collectives reach
    # estimate reproduces the searched numbers from the plan alone (the profile file may be gone)
    searched = json.loads(out)["predicted"]
    tiny_copy = tiny_profile.read_bytes()
    tiny_profile.unlink()
    try:
        rc, out, err = run(["estimate", str(plan_path), "--json"], capsys)
    finally:
        tiny_profile.write_bytes(tiny_copy)
    assert rc == 0, err
    again = json.loads(out)["predicted"]
    for k in ("step_time_s", "tokens_per_s", "mfu", "max_memory_gib"):
        assert again[k] == searched[k]
    rc, out, err = run(["validate", str(plan_path)], capsys)
    assert rc == 0 and "valid" in out


def test_profile_changes_the_prediction_and_estimate_can_apply_it_later(tiny_profile, tmp_path, capsys):
    plain = tmp_path / "plain.yaml"
    assert main(SEARCH + ["-o", str(plain), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)["predicted"]["step_time_s"]
    rc, out, err = run(["estimate", str(plain), "--json", "--profile", str(tiny_profile)], capsys)
    assert rc == 0, err
    after = json.loads(out)["predicted"]["step_time_s"]
    assert after != before  # measured CPU figures, not the catalogue's


def _one_line_error(argv, capsys, *needles):
    rc, out, err = run(argv, capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def _write(tmp_path, doc) -> str:
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return str(p)


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.pop("autopar_profile"), "profile.autopar_profile"),
    (lambda d: d.__setitem__("autopar_profile", 99), "version 99"),
    (lambda d: d["compute"].pop("peak_tflops"), "profile.compute.peak_tflops"),
    (lambda d: d["communication"]["fits"][2]["allreduce"].__setitem__("alpha_s", -1.0), "must be >= 0"),
    (lambda d: d["memory"]["units"].pop("head"), "profile.memory.units.head"),
    (lambda d: d["memory"]["state_table"].pop("zero2"), "zero2"),
])
def test_malformed_profiles_are_refused_with_one_line(tiny_profile, tmp_path, capsys, mutate, needle):
    doc = yaml.safe_load(tiny_profile.read_text())
    mutate(doc)
    _one_line_error(SEARCH + ["--profile", _write(tmp_path, doc), "-o", str(tmp_path / "p.yaml")], capsys, needle)


def test_unreadable_profiles_are_refused_with_one_line(tmp_path, capsys):
    _one_line_error(SEARCH + ["--profile", str(tmp_path / "nope.yaml")], capsys, "profile", "cannot read")
    _one_line_error(SEARCH + ["--profile", _write(tmp_path, "a: [1, 2\n")], capsys, "not valid YAML")
    _one_line_error(SEARCH + ["--profile", _write(tmp_path, "- 1\n")], capsys, "expected a mapping")


@pytest.mark.parametrize("args,needles", [
    (["--model", "llama-tiny"], ("profile.model", "gpt-tiny", "autopar profile --model llama-tiny")),
    (["--seq-len", "16"], ("profile.model", "seq_len 16")),
    (["--cluster", "4xcpu"], ("profile.communication", "groups of [3, 4]", "--nproc 4")),
    (["--cluster", "2xA100"], ("profile.device", "A100")),
    (["--cluster", "2xcpu+2xA100"], ("profile.device", "mixes")),
])
def test_mismatched_profiles_are_refused_with_one_line(tiny_profile, tmp_path, capsys, args, needles):
    argv = list(SEARCH)
    for flag, value in zip(args[::2], args[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    _one_line_error(argv + ["--profile", str(tiny_profile), "-o", str(tmp_path / "p.yaml")], capsys, *needles)
