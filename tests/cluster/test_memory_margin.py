"""A stated safety margin: plans keep a share of each GPU's memory free (``Cluster.with_memory_margin``), one
rule for the search, the estimate, the validator and the plan file."""

from __future__ import annotations

import json

import pytest

from autopar.cli import main
from autopar.cluster.parse import load_cluster
from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.plan.io import load_plan
from autopar.plan.validate import validate_plan
from autopar.search import search
from autopar.search.hetero.baselines import slowest_uniform_cluster
from tests.search.hetero import hetlib

SEARCH = ["search", "--model", "llama2-7b", "--cluster", "2x8xA100-80G", "--global-batch-size", "512",
          "--seq-len", "4096", "--no-baselines", "--json"]


def test_the_budget_is_each_gpus_usable_memory_less_the_margin_then_the_cap():
    c = load_cluster("4xA100-80G+4xT4").with_memory_margin(0.25)
    a100, t4 = 0, 4
    assert c.budget_gib(a100) == pytest.approx(80 * 0.75)
    assert c.budget_gib(t4) == pytest.approx(16 * 15 / 16 * 0.75)  # ECC's share first, then the margin
    assert c.budget_gib(a100, 50.0) == 50.0 and c.budget_gib(t4, 50.0) == pytest.approx(11.25)
    assert load_cluster("4xA100-80G").budget_gib(0) == 80.0  # no margin unless one is stated


def test_the_margin_is_checked_and_kept_by_derived_clusters():
    c = load_cluster("4xA100-80G+4xT4")
    assert c.memory_margin == 0.0 and c.with_memory_margin(0.0) is c
    for bad in (1.0, -0.1, 2.0):
        with pytest.raises(AutoparError) as e:
            c.with_memory_margin(bad)
        assert e.value.field == "memory_margin" and "[0, 1)" in str(e.value)
    m = c.with_memory_margin(0.2)
    assert m.at_precision("fp32").memory_margin == 0.2
    slow = slowest_uniform_cluster(m)  # every GPU as the T4: its usable 15 GiB, the margin applied once
    assert slow.budget_gib(0) == pytest.approx(15 * 0.8)


def test_search_fits_under_the_margin_and_the_plan_file_keeps_it(tmp_path, capsys):
    free = tmp_path / "free.yaml"
    kept = tmp_path / "kept.yaml"
    assert main(SEARCH + ["-o", str(free)]) == 0
    loose = json.loads(capsys.readouterr().out)["predicted"]["max_memory_gib"]
    assert loose > 40.0  # the margin below must change the plan
    assert main(SEARCH + ["-o", str(kept), "--memory-margin", "0.5"]) == 0
    tight = json.loads(capsys.readouterr().out)["predicted"]
    assert tight["max_memory_gib"] <= 40.0 + 1e-9
    plan = load_plan(kept)
    assert plan.cluster.memory_margin == 0.5 and "memory_margin: 0.5" in kept.read_text()
    est = estimate_plan(plan, _model())
    assert est.step_time_s == pytest.approx(tight["step_time_s"], rel=1e-12)  # one number
    validate_plan(plan, _model(), est.memory_gib)
    unmargined = load_plan(free)
    unmargined.cluster = unmargined.cluster.with_memory_margin(0.5)
    with pytest.raises(AutoparError, match=r"exceeds the budget 40\.00 GiB \(A100-80G memory less memory_margin 0\.5\)"):
        validate_plan(unmargined, _model(), estimate_plan(unmargined, _model()).memory_gib)
    assert main(["validate", str(kept)]) == 0
    capsys.readouterr()
    for margin, fits in (("0.5", False), ("0.1", True)):  # estimate holds a plan to another margin
        assert main(["estimate", str(free), "--json", "--memory-margin", margin]) == 0
        assert json.loads(capsys.readouterr().out)["fits"] is fits


def test_a_heterogeneous_search_keeps_every_device_under_its_own_margin():
    mdl, cluster = hetlib.model(blocks=4), hetlib.mixed(per_node=2)
    loose = search(mdl, cluster, 8, hetlib.opts(), with_baselines=False)
    share = {d: g / cluster.budget_gib(d) for d, g in loose.estimate.memory_gib.items()}
    margin = round(1 - max(share.values()) + 0.1, 3)  # tighter than the loose plan's fullest device
    tight_cluster = cluster.with_memory_margin(margin)
    tight = search(mdl, tight_cluster, 8, hetlib.opts(), with_baselines=False)
    for d, gib in tight.estimate.memory_gib.items():
        assert gib <= cluster.budget_gib(d) * (1 - margin) + 1e-9
    validate_plan(tight.plan, mdl, tight.estimate.memory_gib)
    assert tight.plan.cluster.memory_margin == margin


def _model():
    from autopar.modelspec.load import load_model

    return load_model("llama2-7b", 4096)
