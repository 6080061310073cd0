"""zb-h1 plans (``schedule: zb-h1``): the rules, the file round trip."""

from __future__ import annotations

from dataclasses import replace

import pytest
from plan_testlib import base_plan, model_spec

from autopar.errors import AutoparError
from autopar.plan.io import dump_plan_yaml, load_plan, plan_to_dict, save_plan
from autopar.plan.schema import Stage
from autopar.plan.validate import plan_problems, validate_plan


def zb_plan():
    """base_plan under zb-h1, its ZeRO-3 units at ZeRO-2 (what zb-h1 runs)."""
    plan = base_plan()
    plan.schedule = "zb-h1"
    for st in plan.pipelines[0].stages:
        st.layers[:] = [replace(ly, strategy=replace(ly.strategy, zero=min(ly.strategy.zero, 2))) for ly in st.layers]
    return plan


def test_a_zb_plan_is_valid_and_round_trips(tmp_path):
    plan = zb_plan()
    assert len(plan.pipelines[0].stages) >= 2
    assert plan_problems(plan, model_spec(), {d: 10.0 for d in range(8)}) == []
    path = save_plan(plan, tmp_path / "zb.yaml")
    assert "schedule: zb-h1" in dump_plan_yaml(plan)
    again = load_plan(path)
    assert again.schedule == "zb-h1" and plan_to_dict(again) == plan_to_dict(plan)


def test_zb_on_one_stage_is_refused():
    plan = zb_plan()
    layers = [ly for st in plan.pipelines[0].stages for ly in st.layers]
    plan.pipelines = [replace(plan.pipelines[0], stages=[Stage(list(range(8)), layers)])]
    problems = plan_problems(plan, model_spec())
    assert "pipelines[0].stages: schedule zb-h1 on a single-stage pipeline" in "\n".join(problems)
    plan.schedule = "1f1b"
    assert "single-stage" not in "\n".join(plan_problems(plan, model_spec()))


@pytest.mark.parametrize("field,value,words", [("zero", 3, "zero 3"), ("ckpt", "op", "ckpt op")])
def test_zb_with_what_the_split_backward_cannot_run_is_refused_naming_the_pair(field, value, words):
    plan = zb_plan()
    st = plan.pipelines[0].stages[1]
    st.layers[0] = replace(st.layers[0], strategy=replace(st.layers[0].strategy, **{field: value}))
    problems = [p for p in plan_problems(plan, model_spec()) if "zb-h1" in p]
    assert problems and problems[0].startswith(f"pipelines[0].stages[1].layers[0]: schedule zb-h1 with {words}")
    with pytest.raises(AutoparError, match=f"schedule zb-h1 with {words}"):
        validate_plan(plan, model_spec())
    plan.schedule = "1f1b"
    assert not [p for p in plan_problems(plan, model_spec()) if "zb-h1" in p]
