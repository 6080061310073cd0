"""Plans that do not fit the model or the world are refused with one AutoparError line naming the field."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.runtime.checks import check_plan
from autopar.units import unit_tp_info, units
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, gpt, mlp, same


def _check(model, plan, world):
    named = units(model)
    check_plan(plan, [n for n, _ in named], {n: unit_tp_info(model, n, m) for n, m in named}, world)


def _refused(model, plan, world, *words):
    with pytest.raises(AutoparError) as err:
        _check(model, plan, world)
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_good_plans_pass():
    _check(gpt(), make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2))])]), 2)
    _check(mlp(), make_plan([(2, 2, [([0], same(MLP_UNITS[:2])), ([1], same(MLP_UNITS[2:]))])]), 2)


def test_world_size_mismatch():
    _refused(gpt(), make_plan([(4, 2, [([0, 1], same(GPT_UNITS))])]), 4, "2 devices", "4 processes")


def test_unknown_unit():
    _refused(gpt(), make_plan([(4, 1, [([0], same(["embed", "layers.0", "layers.7", "head"]))])]), 1,
             "unknown unit 'layers.7'")


def test_unit_placed_twice_in_one_pipeline():
    plan = make_plan([(4, 1, [([0], same(GPT_UNITS[:2])), ([1], same(GPT_UNITS[1:]))])])
    _refused(gpt(), plan, 2, "layers.0", "more than once")


def test_missing_unit():
    _refused(gpt(), make_plan([(4, 1, [([0], same(GPT_UNITS[:3]))])]), 1, "'head'", "not placed")


def test_units_out_of_order():
    _refused(gpt(), make_plan([(4, 1, [([0], same(["embed", "layers.1", "layers.0", "head"]))])]), 1,
             "out of execution order")


def test_tp_on_a_unit_without_tp_plan():
    _refused(mlp(), make_plan([(4, 1, [([0, 1], same(MLP_UNITS, tp=2))])]), 2, "tp", "'0'", "no tensor-parallel")


def test_tp_not_dividing_heads():
    plan = make_plan([(3, 1, [([0, 1, 2], [("embed", {}), ("layers.0", {"tp": 3}), ("layers.1", {}), ("head", {})])])])
    _refused(gpt(), plan, 3, "layers.0.tp", "tp 3 does not divide")


def test_micro_batch_not_divisible_by_dp():
    _refused(mlp(), make_plan([(3, 1, [([0, 1], same(MLP_UNITS))])]), 2, "micro_batch_size 3", "dp 2")


def test_device_listed_twice():
    plan = make_plan([(2, 1, [([0], same(MLP_UNITS[:2])), ([0], same(MLP_UNITS[2:]))])])
    _refused(mlp(), plan, 2, "devices", "more than once")


def test_batch_share_mismatch():
    plan = make_plan([(2, 2, [([0], same(MLP_UNITS))])])
    plan.pipelines[0].batch_share = 5
    plan.global_batch_size = 5
    _refused(mlp(), plan, 1, "batch_share", "micro_batch_size")


def test_zero3_with_tp_needs_a_2d_mesh():
    plan = make_plan([(2, 1, [([0, 3, 2, 1], same(GPT_UNITS, tp=2, zero=3))])])
    _refused(gpt(), plan, 4, "zero 3 with tp 2", "increasing order")


def test_tied_weights_across_units_are_refused():
    from torch import nn

    from autopar.runtime.checks import check_untied

    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, nn.ReLU(), head)
    with pytest.raises(AutoparError, match="0.weight and 2.weight are the same tensor"):
        check_untied(units(model))
    check_untied(units(mlp()))
