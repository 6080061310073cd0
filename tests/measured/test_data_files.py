"""Every public measured file in benchmarks/data loads, accounts for each case, and reproduces its derivations."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from autopar.estimate import estimate_plan
from autopar.measured.load import load_runs

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
FILES = sorted(DATA.glob("*.yaml"))


def test_the_data_folder_has_the_files_the_readme_lists():
    readme = (DATA / "README.md").read_text()
    assert FILES and all(f"`{p.name}`" in readme for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_file_loads_and_every_case_is_a_run_a_failure_or_a_named_skip(path):
    doc = yaml.safe_load(path.read_text())
    rs = load_runs(path)
    assert len(rs.runs) + len(rs.failed) + len(rs.skipped) == len(doc["cases"])
    assert all(s.reason and s.detail for s in rs.skipped)
    for run in rs.runs[:3] + rs.failed[:1]:  # a few per file: the reader's plans estimate
        est = estimate_plan(run.plan, run.model)
        assert math.isfinite(est.step_time_s) and est.step_time_s > 0


@pytest.mark.parametrize("path", [p for p in FILES if "tps_per_gpu" in p.read_text()], ids=lambda p: p.stem)
def test_step_times_from_tokens_per_gpu_reproduce_the_published_throughput(path):
    """measured_s = global tokens per step / (tokens/s/GPU x GPUs), whatever the layout."""
    doc = yaml.safe_load(path.read_text())
    seq_default = doc["model"].get("seq_len")
    checked = 0
    for c in doc["cases"]:
        tps = (c.get("published") or {}).get("tps_per_gpu")
        if tps is None or c.get("measured_s") is None:
            continue
        seq = c.get("seq_len", seq_default)
        gbs = c.get("global_batch_size", doc["global_batch_size"])
        gpus = c["pp"] * c["tp"] * c.get("cp", 1) * c["dp"]
        assert c["measured_s"] == pytest.approx(gbs * seq / (tps * gpus), rel=2e-3), c["id"]
        checked += 1
    assert checked


def _benchmark(name: str = "eager_traffic"):
    """benchmarks/<name>.py as a module (benchmarks/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, DATA.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_eager_traffic_a_file_states_is_the_count_of_its_framework_s_block():
    """act_traffic stated for an eager framework is counted (benchmarks/eager_traffic.py), never fitted: each
    stated figure is the count for the case's own shape under that framework's transcribed block."""
    bench = _benchmark()
    checked = 0
    for path, block in ((DATA / "torchtitan_h100_llama3_202412.yaml", bench.torchtitan_block),
                        (DATA / "fms_fsdp_a100_llama2_202403.yaml", bench.fms_block),
                        (DATA / "fms_fsdp_h100_llama2_202403.yaml", bench.fms_block)):
        doc = yaml.safe_load(path.read_text())
        seen = set()
        for c in doc["cases"]:
            if c.get("compile"):
                continue
            stated = (c.get("cost_params") or {}).get("act_traffic", doc["framework"]["cost_params"].get("act_traffic"))
            cfg = c["hf_config"]
            shape = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                     cfg["intermediate_size"], c.get("seq_len", doc["model"].get("seq_len")))
            if shape in seen:
                continue
            seen.add(shape)
            counted = block(*shape)
            assert stated == pytest.approx((counted["fwd"] + counted["bwd"]) / bench.saved_bytes(*shape), abs=0.006)
            checked += 1
    assert checked == 9  # torchtitan's eager 8B; fms's 7B, 13B, 34B, 70B in each of its two files


def test_transformers_llama_block_moves_what_torchtitan_s_does():
    """The module autopar's runtime trains (transformers' LlamaDecoderLayer, a tiny config on meta) and
    torchtitan's transcribed block are both eager Llama blocks: their counted traffic agrees within a few per
    cent, several times the fused kernels' 3."""
    bench = _benchmark()
    shape = (256, 4, 2, 512, 64)
    saved = bench.saved_bytes(*shape)
    hf, titan = (f(*shape) for f in (bench.hf_block, bench.torchtitan_block))
    ratios = [(c["fwd"] + c["bwd"]) / saved for c in (hf, titan)]
    assert ratios[0] == pytest.approx(ratios[1], rel=0.05)
    assert min(ratios) > 3 * 3
    assert hf["kernels"][0] >= 30 and hf["kernels"][1] > hf["kernels"][0]


def test_the_sailor_file_states_the_counted_traffic_of_megatron_s_fp32_opt_block():
    """Sailor's OPT-350 runs (Megatron-DeepSpeed at fp32, whose fused softmax steps aside for fp32 scores) state the
    act_traffic benchmarks/megatron_opt_traffic.py counts for the transcribed block at the runs' shape: more than the
    fused kernels' 3, and the backward moves more than the forward."""
    bench = _benchmark("megatron_opt_traffic")
    doc = yaml.safe_load((DATA / "sailor_gh200_opt350_clariden.yaml").read_text())
    cfg = doc["model"]["hf_config"]
    shape = (cfg["n_embd"], cfg["n_head"], cfg["n_inner"], doc["model"]["seq_len"])
    fwd, bwd, kernels = bench.counted(*shape)
    assert doc["framework"]["cost_params"]["act_traffic"] == pytest.approx((fwd + bwd) / bench.saved_bytes(*shape),
                                                                            abs=0.006)
    assert doc["framework"]["cost_params"]["act_traffic"] > 2 * 3 and bwd > 2 * fwd
    assert doc["model"]["precision_mode"] == "tf32"  # NGC's image: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1


def test_the_sailor_file_states_the_per_call_cost_its_own_profile_measures(monkeypatch):
    """The Sailor runs' collective_call_s is what Sailor's per-layer profile of the same block on the same GH200 nodes
    at the runs' TP degree reads per TP all-reduce (benchmarks/sailor_layer_profile.py), not a fit to the step times."""
    monkeypatch.syspath_prepend(str(DATA.parent))  # the profile benchmark imports megatron_opt_traffic beside it
    bench = _benchmark("sailor_layer_profile")
    doc = yaml.safe_load((DATA / "sailor_gh200_opt350_clariden.yaml").read_text())
    (tp,) = {c["tp"] for c in doc["cases"]}
    profile = yaml.safe_load(bench.PROFILE.read_text())
    read = [c for c in bench.call_costs(profile) if (c["model"], c["gpu"], c["tp"]) == ("OPT-350", "GH200", tp)]
    assert doc["framework"]["cost_params"]["collective_call_s"] == pytest.approx(read[0]["per_collective_s"], abs=1e-6)
