"""The closest expressible plan: exact when the plan is expressible, otherwise a valid, fitting, uniform
plan of the target with every change listed and its figures from the same cost model."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.export import TARGETS, prepare
from autopar.export.caps import CAPS
from autopar.export.shape import changes, describe, even_split
from autopar.plan.validate import plan_problems
from autopar.planned import load_planned


@pytest.mark.parametrize("target", TARGETS)
def test_a_uniform_plan_the_target_takes_is_exported_unchanged(plans, target):
    ex = prepare(plans["exact-dp"], target)
    assert ex.changes == []
    assert ex.estimate.step_time_s == pytest.approx(ex.original_estimate.step_time_s, rel=1e-12)
    assert "exact: the plan as searched" in ex.header_lines()[1]


@pytest.mark.parametrize("target", ["torchtitan", "megatron"])
def test_pipelined_and_uneven_plans_are_exact_where_the_tool_takes_a_layer_list(plans, target):
    ex = prepare(plans["exact-pp2"], target)
    assert ex.changes == [] and ex.shape.pp == 2 and ex.shape.tp == 2
    uneven = prepare(plans["uneven-pp2"], target)
    assert uneven.changes == [] and len(uneven.shape.split[0]) == len(uneven.shape.split[1]) + 2  # 13 + 1 vs 13 - 1


def test_tools_without_an_explicit_split_get_the_even_one_listed(plans):
    ex = prepare(plans["uneven-pp2"], "deepspeed")
    assert any(c.startswith("units per stage:") for c in ex.changes)
    assert ex.shape.split == even_split(ex.model, 2)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["readme", "hetero", "hetero-13b", "small"])
def test_the_closest_plan_is_valid_fits_and_is_estimated_by_the_same_cost_model(plans, name, target):
    try:
        ex = prepare(plans[name], target)
    except AutoparError as e:  # only a data-parallel-only tool on a batch that does not split over the devices
        assert name.startswith("hetero") and target == "accelerate", str(e)
        assert "does not split into whole samples over" in str(e) and "\n" not in str(e)
        return
    _, model, params = load_planned(plans[name])
    assert plan_problems(ex.plan, model, ex.estimate.memory_gib) == []
    assert ex.estimate.fits
    again = estimate_plan(ex.plan, model, params)
    assert again.step_time_s == pytest.approx(ex.estimate.step_time_s, rel=1e-12)
    assert ex.changes == changes(ex.original, ex.plan) and ex.changes  # these searched plans mix strategies
    d = describe(ex.plan)
    assert len(ex.plan.pipelines) == ex.shape.replicas and "/" not in d["devices per stage"]
    caps = CAPS[target]
    strategies = {ly.strategy for st in ex.plan.stages for ly in st.layers if ly.name.startswith("layers.")}
    assert len(strategies) == 1  # one strategy for every block
    s = strategies.pop()
    assert s.zero in caps.zero_levels(ex.shape.pp) and s.ckpt in caps.ckpt
    assert f"{ex.original_estimate.step_time_s:.4g} s for the original" in "\n".join(ex.header_lines())


def test_hetero_plan_changes_name_the_pipelines_and_devices(plans):
    ex = prepare(plans["hetero"], "megatron")
    fields = [c.split(":")[0] for c in ex.changes]
    assert {"pipelines", "devices per stage", "devices"} <= set(fields)  # (its stages all run tp 2 now)
    assert ex.plan.devices == list(range(24))  # Megatron's rank order


def test_gpipe_stays_in_torchtitan_and_becomes_1f1b_where_the_tool_has_no_gpipe(plans):
    assert prepare(plans["gpipe-pp2"], "torchtitan").changes == []
    for target in ("megatron", "deepspeed"):
        ex = prepare(plans["gpipe-pp2"], target)
        assert "schedule: gpipe -> 1f1b" in ex.changes and ex.plan.schedule == "1f1b"


def test_exact_refuses_naming_the_change_and_the_closest(plans):
    with pytest.raises(AutoparError) as e:
        prepare(plans["small"], "accelerate", exact=True)
    msg = str(e.value)
    # the searched plan runs TP (accelerate has none), so tp and what goes with it change; the first change is shown
    assert "cannot express the plan exactly (tp, zero" in msg and "would change; tp:" in msg
    assert "closest: pp1 tp1" in msg and "\n" not in msg


def test_unknown_target_is_refused(plans):
    with pytest.raises(AutoparError, match="unknown target 'jax'"):
        prepare(plans["small"], "jax")

