"""The ``cp`` field: YAML round trip (absent at its default), the reader's one-line refusal, and Llama 3
405B at 128K with CP16 (benchmarks/frontier_cp.py) as a plan that validates and estimates."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.modelspec.zoo import from_zoo
from autopar.plan.io import dump_plan_yaml, plan_from_dict, plan_to_dict
from autopar.plan.schema import Strategy
from autopar.plan.validate import plan_problems, validate_plan

ROOT = Path(__file__).resolve().parents[2]


def _frontier_cp():
    spec = importlib.util.spec_from_file_location("frontier_cp", ROOT / "benchmarks" / "frontier_cp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cp_round_trips_and_is_absent_at_its_default():
    plan = _frontier_cp().llama3_405b_128k_plan(v=2, ckpt="full")
    text = dump_plan_yaml(plan)
    back = plan_from_dict(yaml.safe_load(text))
    assert [ly.strategy for st in back.stages for ly in st.layers] == [ly.strategy for st in plan.stages
                                                                        for ly in st.layers]
    assert "cp: 16" in text
    for st in plan.stages:
        for i, ly in enumerate(st.layers):
            st.layers[i] = type(ly)(ly.name, Strategy(tp=8, zero=1, ckpt=ly.strategy.ckpt))
    assert "cp:" not in dump_plan_yaml(plan)
    assert Strategy(tp=8, cp=16).short() == "tp8 z0 cp16" and Strategy(tp=8).short() == "tp8 z0"


def test_reader_refuses_a_bad_cp_in_one_line():
    d = plan_to_dict(_frontier_cp().llama3_405b_128k_plan(v=1, ckpt="full"))
    d["pipelines"][0]["stages"][0]["layers"][0]["cp"] = 0
    with pytest.raises(AutoparError, match=r"pipelines\[0\]\.stages\[0\]\.layers\[0\]\.cp"):
        plan_from_dict(d)


def test_llama3_405b_128k_cp16_validates_and_estimates():
    mod = _frontier_cp()
    model = from_zoo("llama3-405b", 131072)
    plan = mod.llama3_405b_128k_plan(v=2, ckpt="full")
    assert plan.world_size == 16384 and plan.global_batch_size * 131072 == 16 * 2**20  # 16M tokens
    st = plan.pipelines[0].stages[0]
    assert {ly.strategy.cp for s in plan.stages for ly in s.layers} == {16}
    assert st.dp(st.layers[0]) == 8 and len(st.devices) == 8 * 16 * 8
    validate_plan(plan, model)
    est = estimate_plan(plan, model)
    assert est.fits and est.step_time_s > 0
    # 16 in-flight micro-batches of 8K tokens per rank fit only with full recomputation (as the script prints)
    rows = {(r["virtual_stages"], r["ckpt"]): r for r in mod.variants()}
    assert rows[(2, "full")]["fits"] and not rows[(1, "none")]["fits"]


def test_sp_with_cp_is_refused_naming_the_pair():
    plan = _frontier_cp().llama3_405b_128k_plan(v=1, ckpt="full")
    ly = plan.pipelines[0].stages[1].layers[0]
    plan.pipelines[0].stages[1].layers[0] = type(ly)(ly.name, Strategy(tp=8, cp=16, zero=1, ckpt="full", sp=True))
    problems = plan_problems(plan, from_zoo("llama3-405b", 131072))
    assert any(p.startswith("pipelines[0].stages[1].layers[0].cp: cp 16 with sp: true") for p in problems), problems
