"""The strategy fields ``reshard`` (ZeRO-3) and ``zero_overlap`` (ZeRO-1/2): round trip through YAML, absent
from the file at their defaults, refused (one line naming the field) with a ZeRO level they do not belong to,
shown by ``Strategy.short``; plans and cost parameters written before them still load."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from plan_testlib import base_plan

from autopar.errors import AutoparError
from autopar.plan.cost_params import read_cost_params
from autopar.plan.io import dump_plan_yaml, plan_from_dict, plan_to_dict
from autopar.plan.schema import StageLayer, Strategy
from cost_models import CostParams

LAYERS = ("pipelines", 0, "stages", 0, "layers")


def _with_options():
    plan = base_plan()
    s0 = plan.pipelines[0].stages[0]
    s0.layers[0] = StageLayer("embed", Strategy(tp=1, zero=3, reshard=False))
    s0.layers[1] = StageLayer("layers.0", Strategy(tp=2, zero=2, ckpt="full", sp=True, zero_overlap=True))
    s1 = plan.pipelines[0].stages[1]
    s1.layers[0] = StageLayer("layers.3", Strategy(tp=4, zero=1, ckpt="selective", zero_overlap=True))
    return plan


def test_options_round_trip_and_are_written_only_when_set():
    plan = _with_options()
    text = dump_plan_yaml(plan)
    assert plan_from_dict(yaml.safe_load(text)) == plan
    entries = [e for st in yaml.safe_load(text)["pipelines"][0]["stages"] for e in st["layers"]]
    assert entries[0] == {"name": "embed", "tp": 1, "zero": 3, "ckpt": "none", "reshard": False}
    assert entries[1]["zero_overlap"] is True and "reshard" not in entries[1]
    plain = dump_plan_yaml(base_plan())
    assert "reshard" not in plain and "zero_overlap" not in plain  # defaults: old plans are written as before


def test_explicit_defaults_read_like_absent_ones():
    d = plan_to_dict(base_plan())
    d["pipelines"][0]["stages"][0]["layers"][0].update(reshard=True, zero_overlap=False)
    assert plan_from_dict(d) == base_plan()


BAD = {
    # (entry index in stage 0, fields set, field named, words of the problem)
    "reshard without zero 3": (1, {"reshard": False}, "reshard", "only ZeRO-3 reshards"),
    "overlap with zero 3": (0, {"zero_overlap": True}, "zero_overlap", "only ZeRO-1/2"),
    "overlap with zero 0": (0, {"zero": 0, "zero_overlap": True}, "zero_overlap", "with zero 0"),
    "reshard not a bool": (0, {"reshard": "no"}, "reshard", "expected true or false"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_options_with_the_wrong_zero_level_name_the_field(case):
    index, fields, field, words = BAD[case]
    d = copy.deepcopy(plan_to_dict(base_plan()))
    d["pipelines"][0]["stages"][0]["layers"][index].update(fields)
    with pytest.raises(AutoparError) as err:
        plan_from_dict(d)
    assert err.value.field == f"pipelines[0].stages[0].layers[{index}].{field}", str(err.value)
    assert words in str(err.value) and "\n" not in str(err.value) and err.value.fix


def test_schema_refuses_the_pairs_directly():
    with pytest.raises(AutoparError, match="reshard: False with zero 2"):
        Strategy(zero=2, reshard=False)
    with pytest.raises(AutoparError, match="zero_overlap: True with zero 3"):
        Strategy(zero=3, zero_overlap=True)


def test_short_labels():
    assert Strategy(zero=3, reshard=False).short() == "tp1 z3 nr"
    assert Strategy(tp=2, zero=1, ckpt="full", sp=True, zero_overlap=True).short() == "tp2 z1 ov ful sp"
    assert Strategy(zero=3).short() == "tp1 z3"


def test_cost_params_written_before_the_overlap_coefficients_load_with_their_defaults():
    stored = json.loads(json.dumps(CostParams().to_dict()))  # as a plan file holds it (lists)
    for name in ("overlap_grad_reduce", "overlap_param_gather"):
        del stored[name]
    got = CostParams.from_dict(read_cost_params(stored, "search.cost_params", "search again"))
    assert got == CostParams()
    stored["overlap_zero3"] = 1.5
    with pytest.raises(AutoparError, match="overlap_zero3"):
        read_cost_params(stored, "search.cost_params", "search again")
    with pytest.raises(AutoparError, match="overlap_grad_reduce"):
        read_cost_params({**stored, "overlap_grad_reduce": 2.0, "overlap_zero3": 1.0}, "search.cost_params", "x")
