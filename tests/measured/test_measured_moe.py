"""Measured MoE runs: the ``ep`` case field becomes the MoE units' expert parallel degree, the published Mixtral
8x7B run (benchmarks/data/megatron_h100_mixtral_moe.yaml) loads, its derivation is reproduced, and it is scored."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from autopar.estimate import estimate_plan
from autopar.measured.load import load_runs

FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "megatron_h100_mixtral_moe.yaml"


def test_published_mixtral_run_loads_with_ep_on_the_moe_units_only():
    rs = load_runs(FILE, strict=True)
    assert len(rs.runs) == 1 and not rs.skipped and not rs.failed
    run = rs.runs[0]
    assert run.plan.schedule == "interleaved" and run.plan.pipelines[0].virtual_stages == 8
    for st in run.plan.stages:
        for ly in st.layers:
            assert ly.strategy.ep == (8 if run.model.layer(ly.name).moe is not None else 1)
            assert ly.strategy.zero == 1 and ly.strategy.tp == 1
    assert run.model.num_params == 46_702_792_704


def test_the_file_derivation_reproduces_measured_seconds():
    doc = yaml.safe_load(FILE.read_text())
    cfg, case = doc["model"]["hf_config"], doc["cases"][0]
    B, s, h, L = doc["global_batch_size"], doc["model"]["seq_len"], cfg["hidden_size"], cfg["num_hidden_layers"]
    g_a = cfg["num_key_value_heads"] / cfg["num_attention_heads"]
    terms = (1 + g_a + s / h) + cfg["intermediate_size"] / h * cfg["num_experts_per_tok"] * 1.5 \
        + cfg["vocab_size"] / (2 * L * h)
    flops = 12 * B * s * L * h * h * terms
    assert abs(flops / 1e15 - case["model_pflop_per_step"]) < 1e-3
    measured = flops / (case["published"]["tflops_per_gpu"] * 1e12 * case["gpus"])
    assert abs(measured - case["measured_s"]) < 1e-4


def test_the_run_is_scored_and_needs_its_expert_parallelism_to_fit(tmp_path):
    run = load_runs(FILE, strict=True).runs[0]
    est = estimate_plan(run.plan, run.model)
    assert 0.5 < est.step_time_s / run.measured_s < 2.0
    assert max(est.memory_gib.values()) <= 80
    doc = yaml.safe_load(FILE.read_text())
    doc["cases"][0]["ep"] = 1
    path = tmp_path / "ep1.yaml"
    path.write_text(yaml.safe_dump(doc))
    plain = load_runs(path, strict=True).runs[0]
    assert max(estimate_plan(plain.plan, plain.model).memory_gib.values()) > 80  # 8x7B without EP: over 80 GB


def test_an_ep_the_experts_cannot_take_is_skipped_with_the_rule(tmp_path):
    doc = copy.deepcopy(yaml.safe_load(FILE.read_text()))
    doc["cases"][0]["ep"] = 16
    path = tmp_path / "ep16.yaml"
    path.write_text(yaml.safe_dump(doc))
    rs = load_runs(path)
    assert not rs.runs and rs.skipped[0].reason == "refused"
    assert "ep 16 does not divide the 8 experts" in rs.skipped[0].detail


def test_zero_overlap_reaches_the_moe_units_unless_their_experts_are_sharded(tmp_path):
    """The file's ``--overlap-grad-reduce`` (zero_overlap) holds for every unit the plan rules let take it: all
    of them at ep 1, the dense units only at ep 8 (plan/expert_rules: expert parallel runs with plain ZeRO)."""
    doc = yaml.safe_load(FILE.read_text())
    assert doc["cases"][0]["zero_overlap"] is True
    for ep, moe_overlaps in ((8, False), (1, True)):
        doc["cases"][0]["ep"] = ep
        path = tmp_path / f"ep{ep}.yaml"
        path.write_text(yaml.safe_dump(doc))
        run = load_runs(path, strict=True).runs[0]
        for ly in (ly for st in run.plan.stages for ly in st.layers):
            assert ly.strategy.zero_overlap == (run.model.layer(ly.name).moe is None or moe_overlaps)
