"""The plan's ``async_tp`` flag: YAML round trip (absent at its default), label, and the one rule (tp > 1 with sp)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from plan_testlib import base_plan, model_spec

from autopar.errors import AutoparError
from autopar.plan.io import dump_plan_yaml, plan_from_dict, plan_to_dict
from autopar.plan.schema import StageLayer, Strategy
from autopar.plan.validate import plan_problems, validate_plan
from autopar.report import stage_strategies


def _with(plan, stage: int, index: int, **changes):
    st = plan.pipelines[0].stages[stage]
    ly = st.layers[index]
    st.layers[index] = StageLayer(ly.name, dataclasses.replace(ly.strategy, **changes))
    return plan


def test_async_tp_round_trips_and_is_written_only_when_true():
    plan = base_plan()
    assert "async_tp" not in dump_plan_yaml(plan)  # old plans (and plain TP) are written as before
    for i in range(3):  # layers.0-2: tp 2 with sp
        _with(plan, 0, 1 + i, async_tp=True)
    text = dump_plan_yaml(plan)
    assert "{names: layers.0-layers.2, tp: 2, zero: 2, ckpt: full, sp: true, async_tp: true}" in text
    back = plan_from_dict(yaml.safe_load(text))
    assert back.pipelines[0].stages[0].layers == plan.pipelines[0].stages[0].layers
    assert plan_to_dict(back) == plan_to_dict(plan)
    assert plan_problems(back, model_spec()) == []


def test_label_and_plan_table_show_it():
    assert Strategy(tp=2, zero=1, ckpt="full", sp=True, async_tp=True).short() == "tp2 z1 ful sp atp"
    assert Strategy(tp=2, sp=True).short() == "tp2 z0 sp"
    plan = _with(base_plan(), 0, 1, async_tp=True)
    assert "layers.0 tp2 z2 ful sp atp | layers.1..layers.2 tp2 z2 ful sp" in stage_strategies(plan.pipelines[0].stages[0])


@pytest.mark.parametrize("stage,index,changes,pair", [
    (0, 1, {"sp": False, "async_tp": True}, "tp 2 and sp false"),  # tp > 1 without sp
    (0, 0, {"async_tp": True}, "tp 1 and sp false"),  # tp 1
])
def test_async_tp_needs_tp_with_sp_and_the_message_names_the_pair(stage, index, changes, pair):
    plan = _with(base_plan(), stage, index, **changes)
    where = f"pipelines[0].stages[{stage}].layers[{index}].async_tp"
    problems = plan_problems(plan, model_spec())
    assert len(problems) == 1 and problems[0].startswith(f"{where}: async_tp with {pair}")
    with pytest.raises(AutoparError) as e:
        validate_plan(plan, model_spec())
    assert str(e.value) == problems[0] and str(e.value).endswith("; set async_tp: false, or tp >= 2 with sp: true")


def test_reading_a_non_boolean_names_the_field():
    d = plan_to_dict(base_plan())
    d["pipelines"][0]["stages"][0]["layers"][1]["async_tp"] = "yes"
    with pytest.raises(AutoparError, match=r"pipelines\[0\]\.stages\[0\]\.layers\[1\]\.async_tp"):
        plan_from_dict(d)
