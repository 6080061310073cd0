"""Plans that do not fit the model or the world are refused with one AutoparError line naming the field.

The runtime applies the plan rules of ``autopar validate`` (autopar/plan/rules.py): for every fault
both can see, ``check_plan`` (what ``wrap`` runs) and ``validate_plan`` (with the model traced into a
ModelSpec) raise the identical message.
"""

from __future__ import annotations

import functools

import pytest
import torch

from autopar.errors import AutoparError
from autopar.modelspec import ModelSpec
from autopar.plan.compact import make_plan
from autopar.plan.validate import validate_plan
from autopar.runtime.checks import check_plan
from autopar.units import unit_tp_info, units
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, gpt, mlp, same

BUILDERS = {"gpt": gpt, "mlp": mlp}
INPUTS = {"gpt": lambda: torch.zeros(4, 8, dtype=torch.long), "mlp": lambda: torch.zeros(4, 6)}


@functools.cache
def _spec(kind: str) -> ModelSpec:
    return ModelSpec.from_module(BUILDERS[kind](), INPUTS[kind]())


def _check(kind, plan, world):
    model = BUILDERS[kind]()
    named = units(model)
    check_plan(plan, [n for n, _ in named], {n: unit_tp_info(model, n, m) for n, m in named}, world)


def _refused(kind, plan, world, *words):
    with pytest.raises(AutoparError) as err:
        _check(kind, plan, world)
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def _validate(kind, plan):
    plan.model.seq_len = _spec(kind).seq_len  # make_plan's seq_len 1 is not the traced model's
    validate_plan(plan, _spec(kind))


def test_good_plans_pass():
    for kind, plan, world in [("gpt", make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2))])]), 2),
                              ("mlp", make_plan([(2, 2, [([0], same(MLP_UNITS[:2])), ([1], same(MLP_UNITS[2:]))])]), 2)]:
        _check(kind, plan, world)
        _validate(kind, plan)


def _bad_share():
    plan = make_plan([(2, 2, [([0], same(MLP_UNITS))])])
    plan.pipelines[0].batch_share = 5
    plan.global_batch_size = 5
    return plan


# name -> (model, plan builder, world size, words of the message)
SHARED = {
    "unknown unit": ("gpt", lambda: make_plan([(4, 1, [([0], same(["embed", "layers.0", "layers.7", "head"]))])]), 1,
                     ["layers[2].name", "'layers.7' is not a layer unit of the model", "embed, layers.0"]),
    "placed twice": ("gpt", lambda: make_plan([(4, 1, [([0], same(GPT_UNITS[:2])), ([1], same(GPT_UNITS[1:]))])]), 2,
                     ["stages[1].layers[0].name", "'layers.0' is placed twice in pipeline 0"]),
    "missing unit": ("gpt", lambda: make_plan([(4, 1, [([0], same(GPT_UNITS[:3]))])]), 1,
                     ["pipelines[0]: does not place layer unit(s) head"]),
    "out of order": ("gpt", lambda: make_plan([(4, 1, [([0], same(["embed", "layers.1", "layers.0", "head"]))])]), 1,
                     ["layers[2].name", "'layers.0' comes after 'layers.1', against model order"]),
    "tp without a TP plan": ("mlp", lambda: make_plan([(4, 1, [([0, 1], same(MLP_UNITS, tp=2))])]), 2,
                             ["layers[0].tp", "tp 2 is not legal for unit '0' (it has no TP plan)", "set tp: 1"]),
    "tp not dividing heads": (
        "gpt", lambda: make_plan([(3, 1, [([0, 1, 2], [("embed", {}), ("layers.0", {"tp": 3}), ("layers.1", {}),
                                                       ("head", {})])])]), 3,
        ["layers[1].tp", "tp 3 is not legal for unit 'layers.0'", "use tp 1 "]),
    "tp not dividing the stage": ("gpt", lambda: make_plan([(3, 1, [([0, 1, 2], same(GPT_UNITS[:2]) + [
        ("layers.1", {"tp": 2}), ("head", {})])])]), 3, ["layers[2].tp", "tp 2 does not divide the stage's 3 devices"]),
    "dp not dividing the micro-batch": ("mlp", lambda: make_plan([(3, 1, [([0, 1], same(MLP_UNITS))])]), 2,
                                        ["dp = 2 devices / tp 1 = 2 does not divide micro_batch_size 3"]),
    "device twice": ("mlp", lambda: make_plan([(2, 1, [([0], same(MLP_UNITS[:2])), ([0], same(MLP_UNITS[2:]))])]), 2,
                     ["stages[1].devices[0]: device 0 is used twice"]),
    "batch share": ("mlp", _bad_share, 1, ["pipelines[0].batch_share: is 5 but micro_batch_size x num_microbatches"]),
}


@pytest.mark.parametrize("case", SHARED, ids=list(SHARED))
def test_shared_faults_read_the_same_from_validate_and_the_runtime(case):
    kind, build, world, words = SHARED[case]
    runtime_msg = _refused(kind, build(), world, *words)
    with pytest.raises(AutoparError) as err:
        _validate(kind, build())
    assert str(err.value) == runtime_msg


def test_world_size_mismatch_is_a_runtime_rule():
    plan = make_plan([(4, 2, [([0, 1], same(GPT_UNITS))])])
    _validate("gpt", plan)  # the plan itself is fine
    msg = _refused("gpt", plan, 4, "world size:", "cluster has 2 devices", "world has 4 processes", "launch 2 processes")
    assert msg.startswith("world size: ")


def test_zero3_with_tp_needs_a_2d_mesh_at_runtime():
    plan = make_plan([(2, 1, [([0, 3, 2, 1], same(GPT_UNITS, tp=2, zero=3))])])
    _validate("gpt", plan)  # the planner has no meshes: only the runtime refuses it
    _refused("gpt", plan, 4, "pipelines[0].stages[0].devices:", "zero 3 with tp 2", "2-D device mesh",
             "increasing order")
