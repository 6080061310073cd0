"""Expert parallel: what wrap refuses, in one line naming the field and the fix, before any collective
(the plan rules on a real Mixtral's units, wrap settings, HF MoE settings), and ``ep`` in plan files."""

from __future__ import annotations

import pytest
import torch
import yaml

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.plan.io import dump_plan_yaml, plan_from_dict, plan_to_dict
from autopar.plan.rules import ModelFacts, UnitFacts, plan_rules
from autopar.plan.schema import Strategy
from tests.runtime.cases import GPT_UNITS

transformers = pytest.importorskip("transformers")

E, L0, L1, H = GPT_UNITS


def _mixtral(**extra):
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                     num_local_experts=4, num_experts_per_tok=2, **extra)
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg)


def _check(plan) -> None:
    """wrap's pre-collective check on the real model's units (autopar.runtime.checks)."""
    from autopar.models.hf import from_transformers
    from autopar.runtime.checks import check_plan, unit_experts
    from autopar.units import unit_tp_info, units

    model = from_transformers(_mixtral())
    named = units(model)
    infos = {n: unit_tp_info(model, n, m) for n, m in named}
    check_plan(plan, [n for n, _ in named], infos, plan.world_size, unit_experts(named))


def _layers2(**strategy):
    return [(E, {}), (L0, dict(strategy)), (L1, dict(strategy)), (H, {})]


def _plan(devices, embed=None, layer=None):
    embed, layer = embed or {}, layer or {}
    return make_plan([(len(devices) * 2, 1, [(devices, [(E, embed), (L0, layer), (L1, layer), (H, {})])])])


def test_mixtral_units_state_their_experts():
    from autopar.models.hf import from_transformers
    from autopar.runtime.checks import unit_experts
    from autopar.units import units

    assert unit_experts(units(from_transformers(_mixtral()))) == {L0: 4, L1: 4}
    _check(_plan([0, 1], layer={"ep": 2}))  # a legal plan passes


@pytest.mark.parametrize("plan,words", [
    (_plan([0, 1], embed={"ep": 2}), ["ep 2 on unit 'embed', which has no experts", "set ep: 1"]),
    (_plan([0, 1, 2], layer={"ep": 3}), ["ep 3 does not divide the 4 experts of unit 'layers.0'"]),
    (_plan([0, 1, 2, 3, 4, 5], layer={"ep": 4}), ["ep 4 does not divide dp = 6"]),
    (make_plan([(4, 1, [([0, 1, 2, 3], _layers2(ep=2, zero=3))]), (2, 1, [([4, 5], _layers2(ep=2, zero=3))])]),
     ["ep 2 with zero 3 on unit 'layers.0': the runtime shards it alike in every pipeline only on stages of one "
      "size ([2, 4])", "or equal stages"]),
    (make_plan([(4, 1, [([0, 1, 2, 3], _layers2(ep=2, zero=3))]), (4, 1, [([4, 5, 6, 7], _layers2(ep=2, zero=1))])]),
     ["ep 2 on unit 'layers.0' with zero 3 in some pipelines and not in others", "in every pipeline or in none"]),
    (_plan([1, 0], layer={"ep": 2}), ["each EP group's devices must be increasing"]),
])
def test_plans_wrap_cannot_run_are_refused_in_one_line(plan, words):
    with pytest.raises(AutoparError) as e:
        _check(plan)
    assert e.value.field.endswith(".ep")
    for w in words:
        assert w in str(e.value)
    assert "\n" not in str(e.value)


def test_tp_with_ep_names_both():
    facts = ModelFacts(tuple(UnitFacts(n, True, (4,)) for n in GPT_UNITS), experts={L0: 4, L1: 4})
    problems = plan_rules(_plan([0, 1, 2, 3], layer={"ep": 2, "tp": 2}), facts)
    assert [(f, p) for f, p, _ in problems] == [
        (f"pipelines[0].stages[0].layers[{i}].ep", f"tp 2 with ep 2 on unit '{n}': tensor parallel and expert "
         "parallel on one unit are not supported together yet") for i, n in ((1, L0), (2, L1))]


def test_one_ep_per_unit_across_pipelines():
    layers = [(E, {}), (L0, {"ep": 2}), (L1, {}), (H, {})]
    plan = make_plan([(2, 1, [([0, 1], layers)]), (2, 1, [([2, 3], [(E, {}), (L0, {}), (L1, {}), (H, {})])])])
    with pytest.raises(AutoparError, match="has ep 1 here but ep 2 in an earlier pipeline"):
        _check(plan)


def test_experts_in_another_layout_are_refused_with_ep_only():
    from autopar.models.hf import from_transformers
    from autopar.runtime.expert_parallel import check_moe_units
    from autopar.units import units

    named = units(from_transformers(_mixtral()))
    dict(named)[L1].layer.mlp.experts.has_gate = False  # an up_proj and an activation, no gate
    check_moe_units(_plan([0, 1], layer={}), named)  # replicated experts run in any layout
    with pytest.raises(AutoparError, match="^strategy.ep: unit layers.1's experts module MixtralExperts has "
                       "has_gate=False, a layout expert parallel does not run; use ep 1"):
        check_moe_units(_plan([0, 1], layer={"ep": 2}), named)


@pytest.mark.parametrize("setting", ["mixed_precision", "compile"])
def test_wrap_settings_not_built_with_ep_are_refused(setting):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from autopar.runtime.expert_parallel import check_ep_settings

    kwargs = {"mixed_precision": None, "compile_kwargs": None}
    if setting == "compile":
        kwargs["compile_kwargs"] = {}
        plan = _plan([0, 1], layer={"ep": 2})
    else:
        kwargs["mixed_precision"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        plan = _plan([0, 1, 2, 3], layer={"ep": 2, "zero": 3})
        check_ep_settings(_plan([0, 1], layer={"ep": 2, "zero": 2}), **kwargs)  # built for zero 0-2
    with pytest.raises(AutoparError, match=f"^{setting}: is set and unit layers.0 has ep > 1"):
        check_ep_settings(plan, **kwargs)
    check_ep_settings(_plan([0, 1]), **kwargs)  # dense plans: untouched


@pytest.mark.parametrize("extra,field", [({"output_router_logits": True}, "model.config.output_router_logits"),
                                         ({"router_jitter_noise": 0.1}, "model.config.router_jitter_noise")])
def test_moe_settings_wrap_cannot_match_are_refused(extra, field):
    from autopar.models.hf import from_transformers
    from autopar.runtime.expert_parallel import check_moe_units
    from autopar.units import units

    named = units(from_transformers(_mixtral(**extra)))  # the tracer takes it: the plan's figures are unchanged
    with pytest.raises(AutoparError) as e:
        check_moe_units(_plan([0, 1]), named)  # wrap refuses it, whatever the plan
    assert e.value.field == field and "\n" not in str(e.value)
    check_moe_units(_plan([0, 1], layer={"ep": 2}), units(from_transformers(_mixtral())))


def test_ep_round_trips_through_plan_files_and_is_omitted_at_1():
    plan = _plan([0, 1, 2, 3], layer={"ep": 4, "zero": 1})
    text = dump_plan_yaml(plan)
    assert plan_from_dict(yaml.safe_load(text)) == plan
    layers = plan_to_dict(plan)["pipelines"][0]["stages"][0]["layers"]
    assert [ly.get("ep") for ly in layers] == [None, 4, None]  # layers.0-layers.1 share one entry
    assert Strategy(ep=4, zero=1).short() == "tp1 z1 ep4"
    with pytest.raises(AutoparError, match="strategy.ep: must be an integer >= 1"):
        Strategy(ep=0)
