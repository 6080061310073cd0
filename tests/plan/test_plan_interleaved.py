"""Interleaved plans (``schedule: interleaved``, ``virtual_stages``): the rules, the file round trip."""

from __future__ import annotations

import pytest
from plan_testlib import base_plan, model_spec

from autopar.errors import AutoparError
from autopar.plan.io import dump_plan_yaml, load_plan, plan_to_dict, save_plan
from autopar.plan.reader import plan_from_dict
from autopar.plan.schema import Pipeline, Stage, StageLayer, Strategy
from autopar.plan.validate import plan_problems, validate_plan


def interleaved_plan(v: int = 2, m: int = 8):
    """base_plan's 8 units as 2 stages x ``v`` chunks (chunk k on stage k mod 2's devices)."""
    plan = base_plan()
    units = [ly for st in plan.pipelines[0].stages for ly in st.layers]
    devices = [st.devices for st in plan.pipelines[0].stages]
    n = 2 * v
    cuts = [round(i * len(units) / n) for i in range(n + 1)]
    chunks = [Stage(list(devices[k % 2]), units[cuts[k]:cuts[k + 1]]) for k in range(n)]
    plan.pipelines = [Pipeline(32, 32 // m, m, chunks, virtual_stages=v)]
    plan.schedule = "interleaved"
    return plan


def _fields(plan) -> list[str]:
    return plan_problems(plan, model_spec())


@pytest.mark.parametrize("v", [2, 4])
def test_an_interleaved_plan_is_valid_and_counts_each_device_once(v):
    plan = interleaved_plan(v)
    assert plan_problems(plan, model_spec(), {d: 10.0 for d in range(8)}) == []
    assert plan.world_size == 8 and plan.pipelines[0].num_stages == 2
    assert [st.devices for st in plan.pipelines[0].physical_stages] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_virtual_stages_with_another_schedule_is_refused_naming_the_pair():
    plan = interleaved_plan()
    plan.schedule = "1f1b"
    (problem,) = _fields(plan)
    assert problem.startswith("pipelines[0].virtual_stages: virtual_stages 2 with schedule 1f1b")


def test_the_interleaved_schedule_without_virtual_stages_is_refused():
    plan = base_plan()
    plan.schedule = "interleaved"
    (problem,) = _fields(plan)
    assert problem.startswith("pipelines[0].virtual_stages: schedule interleaved with virtual_stages 1")


def test_micro_batches_not_a_multiple_of_the_stage_count_are_refused():
    plan = interleaved_plan(m=8)
    pipe = plan.pipelines[0]
    pipe.num_microbatches, pipe.micro_batch_size, pipe.batch_share = 3, 4, 12
    plan.global_batch_size = 12
    assert any(p.startswith("pipelines[0].num_microbatches: 3 micro-batches with the interleaved schedule on 2 "
                            "stages") for p in _fields(plan))


def test_a_chunk_on_other_devices_is_refused():
    plan = interleaved_plan()
    plan.pipelines[0].stages[2].devices = [4, 5, 6, 7]
    problems = _fields(plan)
    assert problems and problems[0].startswith("pipelines[0].stages[2].devices: chunk 2 runs on [4, 5, 6, 7], "
                                               "not on the devices of chunk 0")


def test_a_chunk_count_not_a_multiple_of_virtual_stages_is_refused():
    plan = interleaved_plan()
    pipe = plan.pipelines[0]
    pipe.stages[2].layers += pipe.stages[3].layers
    del pipe.stages[3]
    assert _fields(plan)[0].startswith("pipelines[0].stages: lists 3 chunks, not a multiple of virtual_stages 2")


def test_one_physical_stage_cannot_interleave():
    plan = interleaved_plan()
    pipe = plan.pipelines[0]
    for st in pipe.stages:
        st.devices = list(range(8))
    pipe.virtual_stages = 4
    assert any("virtual_stages 4 on a single-stage pipeline" in p for p in _fields(plan))


def test_an_empty_chunk_is_refused():
    plan = interleaved_plan()
    plan.pipelines[0].stages[1].layers = []
    with pytest.raises(AutoparError, match=r"pipelines\[0\].stages\[1\].layers: is empty"):
        validate_plan(plan, model_spec())


def test_interleaved_plans_round_trip_and_old_files_read_as_one_chunk(tmp_path):
    plan = interleaved_plan(4)
    back = load_plan(save_plan(plan, tmp_path / "p.yaml"))
    assert back.schedule == "interleaved" and back.pipelines[0].virtual_stages == 4
    assert [st.devices for st in back.pipelines[0].stages] == [st.devices for st in plan.pipelines[0].stages]
    assert "virtual_stages: 4" in dump_plan_yaml(plan)
    old = plan_to_dict(base_plan())
    assert "virtual_stages" not in old["pipelines"][0]  # a plain plan's file is unchanged
    assert plan_from_dict(old).pipelines[0].virtual_stages == 1


def test_a_bad_virtual_stages_value_is_refused_by_the_reader():
    d = plan_to_dict(interleaved_plan())
    d["pipelines"][0]["virtual_stages"] = 0
    with pytest.raises(AutoparError, match=r"pipelines\[0\].virtual_stages"):
        plan_from_dict(d)


def test_per_layer_rules_still_apply_inside_chunks():
    plan = interleaved_plan()
    plan.pipelines[0].stages[3].layers[0] = StageLayer("layers.6", Strategy(tp=3))
    assert any(p.startswith("pipelines[0].stages[3].layers[0].tp") for p in _fields(plan))
