"""Async TP in the exports: torchtitan (compile + enable_async_tensor_parallel) and Megatron (--tp-comm-overlap)
express it exactly; DeepSpeed and accelerate get the closest plan without it, the change listed."""

from __future__ import annotations

import pytest

from autopar.estimate import estimate_plan
from autopar.export import prepare, render
from autopar.export.shape import Shape, build_plan, even_split
from autopar.plan.io import save_plan
from autopar.planned import load_planned
from tests.export.test_parsers import script_args


@pytest.fixture(scope="module")
def atp_plan(plans, tmp_path_factory) -> str:
    """The small plan's model and cluster, pp 2 x tp 2 with sp and async TP on the blocks."""
    planned = load_planned(plans["small"])
    shape = Shape(2, 2, 0, "full", True, 4, even_split(planned.model, 2), async_tp=True)
    plan = build_plan(planned.plan, planned.model, shape)
    plan.predicted = estimate_plan(plan, planned.model, planned.params).predicted()
    path = tmp_path_factory.mktemp("atp") / "atp.yaml"
    save_plan(plan, path)
    return str(path)


def test_only_blocks_run_it(atp_plan):
    plan = load_planned(atp_plan).plan
    flags = {ly.name: ly.strategy.async_tp for st in plan.stages for ly in st.layers}
    assert not flags["embed"] and not flags["head"] and all(v for k, v in flags.items() if k.startswith("layers."))


@pytest.mark.parametrize("target,flags", [
    ("torchtitan", ["--compile.enable", "--compile.enable_async_tensor_parallel"]),
    ("megatron", ["--tp-comm-overlap"])])
def test_tools_with_async_tp_export_it_exactly(atp_plan, target, flags):
    ex = prepare(atp_plan, target)
    assert ex.changes == [] and ex.shape.async_tp
    assert ex.estimate.step_time_s == pytest.approx(ex.original_estimate.step_time_s, rel=1e-12)
    args = script_args(render(ex))
    assert all(f in args for f in flags)
    plain = prepare(_without(atp_plan), target)
    assert not any(f in script_args(render(plain)) for f in flags)


def _without(path: str) -> str:
    """The same plan with async TP off (written beside it)."""
    import dataclasses

    from autopar.plan.schema import StageLayer

    planned = load_planned(path)
    plan = planned.plan
    for st in plan.stages:
        st.layers = [StageLayer(ly.name, dataclasses.replace(ly.strategy, async_tp=False)) for ly in st.layers]
    plan.predicted = estimate_plan(plan, planned.model, planned.params).predicted()
    out = path.replace(".yaml", "-plain.yaml")
    save_plan(plan, out)
    return out


@pytest.mark.parametrize("target", ["deepspeed", "accelerate"])
def test_other_tools_get_the_closest_plan_without_it_with_the_change_listed(atp_plan, target):
    ex = prepare(atp_plan, target)
    assert not any(ly.strategy.async_tp for st in ex.plan.stages for ly in st.layers)
    assert "async tp: off, on x24, off -> off x26" in ex.changes, ex.changes
