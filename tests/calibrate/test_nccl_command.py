"""``autopar calibrate --nccl-tests`` end to end: the calibration it writes changes ``autopar estimate``'s
collective times exactly as the fitted rows and links say, goes with RUNS, and bad input exits 2 with one line."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from autopar.cli import main
from autopar.estimate import estimate_plan
from autopar.planned import load_planned
from autopar.profile import load_profile
from tests.calibrate.nccl_synthetic import SIZES, nccl_text
from tests.calibrate.synthetic import write_measured

DATA = Path(__file__).with_name("data")
OCI = str(DATA / "all_reduce_perf_oci_a100_2x8.txt")


def _plan(tmp_path, cluster: str, capsys, *extra) -> str:
    path = tmp_path / "plan.yaml"
    assert main(["search", "--model", "gpt3-1.3b", "--cluster", cluster, "--global-batch-size", "16", "--seq-len",
                 "512", "--no-baselines", "-o", str(path), "--json", *extra]) == 0
    capsys.readouterr()
    return str(path)


def _estimate(path: str, capsys, *extra) -> float:
    assert main(["estimate", path, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["predicted"]["step_time_s"]


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    """The calibration of the published 2 x 8 A100 all-reduce: the network only."""
    out = tmp_path_factory.mktemp("nccl") / "net.yaml"
    assert main(["calibrate", "--nccl-tests", OCI, "-o", str(out)]) == 0
    return out


def test_a_multi_host_table_sets_the_network_and_says_so(network, capsys, tmp_path):
    doc = yaml.safe_load(network.read_text())
    assert doc["format"] == "autopar-calibration/1" and doc["gpus"] == ["A100-40G"] and doc["cost_params"] == {}
    link = doc["communication"]["inter_link"]
    assert set(doc["communication"]) == {"inter_link"} and link["bw_gbps"] > 0 and link["lat_us"] >= 0
    (t,) = doc["nccl_tests"]
    assert (t["gpus"], t["hosts"], t["per_host"], t["sizes"]) == (16, 2, 8, 31)
    assert [c["size"] for c in t["checks"]] == [8, 8 << 15, 8 << 30]
    assert t["checks"][-1]["measured_s"] == pytest.approx(0.067689)
    assert main(["calibrate", "--nccl-tests", OCI, "-o", str(tmp_path / "again.yaml")]) == 0
    out = capsys.readouterr().out
    assert "allreduce over 16 GPUs (2 hosts x 8)" in out and "reference inter-node link 200 GB/s, 5 us" in out
    assert "set: inter-node link" in out and "67,689.0 us" in out and out.rstrip().endswith("again.yaml")


def test_estimate_prices_the_network_the_tables_measured(network, tmp_path, capsys):
    path = _plan(tmp_path, "2x4xA100-40G", capsys)
    link = yaml.safe_load(network.read_text())["communication"]["inter_link"]
    plan, model, params = load_planned(path)
    measured_net = replace(plan, cluster=replace(plan.cluster, inter_bw_gbps=link["bw_gbps"],
                                                 inter_lat_us=link["lat_us"]))
    want = estimate_plan(measured_net, model, params).step_time_s
    got = _estimate(path, capsys, "--profile", str(network))
    assert math.isclose(got, want, rel_tol=1e-12)
    assert not math.isclose(got, _estimate(path, capsys), rel_tol=1e-6)  # the preset's 200 GB/s, 5 us


def test_a_plan_searched_with_it_validates_when_the_file_is_gone(network, tmp_path, capsys):
    path = _plan(tmp_path, "2x4xA100-40G", capsys, "--profile", str(network))
    assert load_planned(path).plan.cluster.inter_bw_gbps == pytest.approx(
        yaml.safe_load(network.read_text())["communication"]["inter_link"]["bw_gbps"])
    assert main(["validate", path]) == 0 and main(["estimate", path]) == 0  # its recorded calibration is here
    capsys.readouterr()
    doc = yaml.safe_load(open(path))
    doc["search"]["profile"]["path"] = str(tmp_path / "gone.yaml")
    open(path, "w").write(yaml.safe_dump(doc))
    assert main(["validate", path]) == 0
    assert "calibration" in capsys.readouterr().out


def _one_host(tmp_path) -> list[str]:
    """Generated one-host tables of 4 A100-80G, slower than the NVLink the catalogue assumes."""
    out = []
    for c, bw in (("allreduce", 20e9), ("allgather", 30e9), ("reduce_scatter", 25e9)):
        p = tmp_path / f"{c}.txt"
        p.write_text(nccl_text(c, ["h"] * 4, lambda s, bw=bw: 30e-6 + s / bw, SIZES))
        out.append(str(p))
    return out


def test_one_host_tables_become_comm_fit_rows_the_estimate_uses(tmp_path, capsys):
    cal = tmp_path / "rows.yaml"
    assert main(["calibrate", "--nccl-tests", *_one_host(tmp_path), "-o", str(cal), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["cost_params"]["comm_fit"]
    assert [r[:2] for r in rows] == [["allgather", 4], ["allreduce", 4], ["reduce_scatter", 4]]
    assert rows[1][2] == pytest.approx(30e-6, rel=0.01) and rows[1][3] == pytest.approx(1 / 20e9, rel=0.01)
    path = _plan(tmp_path, "4xA100-80G", capsys)
    plan, model, params = load_planned(path)
    want = estimate_plan(plan, model, replace(params, comm_fit=rows)).step_time_s
    got = _estimate(path, capsys, "--profile", str(cal))
    assert math.isclose(got, want, rel_tol=1e-12) and got > _estimate(path, capsys)  # slower than NVLink


def test_runs_and_tables_together(tmp_path, capsys):
    cal = tmp_path / "both.yaml"
    assert main(["calibrate", str(write_measured(tmp_path / "m.yaml")), "--nccl-tests", *_one_host(tmp_path)[:1],
                 "--fit", "eff_max", "--folds", "2", "-o", str(cal)]) == 0
    out = capsys.readouterr().out
    assert "calibrated on 14 run(s) of A100-80G" in out and "set: comm_fit row (allreduce, 4 GPUs)" in out
    prof = load_profile(cal)
    assert prof.kind == "calibration" and set(prof["cost_params"]) == {"comm_fit", "eff_max"}
    assert prof["nccl_tests"][0]["collective"] == "allreduce"


@pytest.mark.parametrize("argv, field", [
    (["calibrate", "-o", "x.yaml"], "calibrate: has nothing to fit"),
    (["calibrate", "--nccl-tests", str(DATA / "all_reduce_perf_rtx5090_1x8.txt"), "-o", "x.yaml"], "--gpu: the tables"),
    (["calibrate", "--nccl-tests", str(DATA / "sendrecv_perf_a100_no_devices.txt"), "-o", "x.yaml"], "devices: lists no"),
    (["calibrate", "--nccl-tests", OCI, "--cluster", "2x8xH100", "-o", "x.yaml"], "--cluster: has H100"),
    (["calibrate", "--nccl-tests", OCI, "--gpu", "RTX5090x", "-o", "x.yaml"], "--gpu: unknown GPU type"),
    (["calibrate", "--nccl-tests", OCI, "--gpu", "A100-40G", "--cluster", "2x8xA100-40G", "-o", "x.yaml"],
     "--gpu: and --cluster both name the GPU"),
    (["calibrate", "--gpu", "A100-40G", "-o", "x.yaml"], "calibrate: has nothing to fit"),
    (["calibrate", str(DATA.parent / "synthetic.py"), "--gpu", "A100-40G", "-o", "x.yaml"], "--gpu: only applies"),
    (["calibrate", "--nccl-tests", OCI, str(DATA.parent / "synthetic.py"), "-o", "x.yaml"], "RUNS go before"),
])
def test_bad_input_exits_2_with_one_line(argv, field, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert field in err and len(err.splitlines()) == 1 and not (tmp_path / "x.yaml").exists()


def test_a_gpu_the_catalogue_lacks_is_named_by_a_cluster_file(tmp_path, capsys):
    """The published PCIe host of 8 RTX 5090: a cluster file defines the GPU; the measured all-reduce is
    slower at large sizes than its PCIe Gen5 link assumes, and the estimate charges what was measured."""
    cluster = tmp_path / "rtx5090.yaml"
    cluster.write_text(yaml.safe_dump({"gpus": {"RTX5090": {"memory_gib": 32, "tflops": 209.5, "hbm_gbps": 1792,
                                                            "pcie_gbps": 64, "class": "pcie"}},
                                       "nodes": [{"gpu": "RTX5090", "count": 8}]}))
    cal = tmp_path / "cal.yaml"
    assert main(["calibrate", "--nccl-tests", str(DATA / "all_reduce_perf_rtx5090_1x8.txt"), "--cluster", str(cluster),
                 "-o", str(cal), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    (row,) = got["cost_params"]["comm_fit"]
    assert row[:2] == ["allreduce", 8] and load_profile(cal)["gpus"] == ["RTX5090"]
    big = got["nccl_tests"][0]["checks"][-1]
    assert big["size"] == 134217728 and big["reference_s"] < 0.9 * big["measured_s"]
    assert big["calibrated_s"] == pytest.approx(big["measured_s"], rel=0.1)
    path = _plan(tmp_path, str(cluster), capsys)
    plan, model, params = load_planned(path)
    want = estimate_plan(plan, model, replace(params, comm_fit=[row])).step_time_s
    assert math.isclose(_estimate(path, capsys, "--profile", str(cal)), want, rel_tol=1e-12)
