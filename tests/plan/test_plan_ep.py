"""Expert parallel (``Strategy.ep``) in plans: YAML round trip (omitted at 1), the short label, and each rule of
``plan.expert_rules`` refusing with the field and the fix, in validate and in the runtime's model facts."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from plan_testlib import A100

from autopar.cluster.cluster import Cluster, Node
from autopar.errors import AutoparError
from autopar.modelspec.spec import LayerSpec, ModelSpec, MoESpec
from autopar.plan.io import dump_plan_yaml, plan_from_dict, plan_to_dict
from autopar.plan.rules import ModelFacts, UnitFacts, plan_rules
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from autopar.plan.validate import plan_problems
from tests.export.test_export_moe import mixtral_plan


def moe_model() -> ModelSpec:
    """embed, two MoE blocks of 8 experts (TP plan: heads 8), head."""
    moe = MoESpec(num_experts=8, top_k=2, expert_params=4000, expert_flops=1e6, dispatch_bytes=1e3)
    blocks = [LayerSpec(f"layers.{i}", "block", params=5000, tp_params=4800, tp_divisors=(8,), moe=moe) for i in range(2)]
    return ModelSpec("moe", 128, [LayerSpec("embed", "embedding", params=100)] + blocks + [LayerSpec("head", "head")])


def plan_with(ep_block: int = 4, ep_embed: int = 1, tp_block: int = 1, devices: int = 8) -> Plan:
    layers = [StageLayer("embed", Strategy(ep=ep_embed))]
    layers += [StageLayer(f"layers.{i}", Strategy(tp=tp_block, zero=1, ep=ep_block)) for i in range(2)]
    layers.append(StageLayer("head", Strategy()))
    cluster = Cluster(nodes=[Node(A100, devices)], name=f"{devices}xA100")
    return Plan(ModelRef("moe", 128, 4, "moe"), cluster, 16, [Pipeline(16, 8, 2, [Stage(list(range(devices)), layers)])])


def test_ep_round_trips_and_is_omitted_at_one():
    plan = plan_with(ep_block=4)
    text = dump_plan_yaml(plan)
    entries = yaml.safe_load(text)["pipelines"][0]["stages"][0]["layers"]
    assert entries[0] == {"name": "embed", "tp": 1, "zero": 0, "ckpt": "none"}  # no ep key at 1
    assert entries[1]["names"] == "layers.0-layers.1" and entries[1]["ep"] == 4
    back = plan_from_dict(yaml.safe_load(text))
    assert [ly.strategy for ly in back.pipelines[0].stages[0].layers] == \
        [ly.strategy for ly in plan.pipelines[0].stages[0].layers]
    assert plan_to_dict(back) == plan_to_dict(plan)


def test_short_label_shows_ep():
    assert Strategy(zero=1, ep=4).short() == "tp1 z1 ep4"
    assert Strategy(zero=1).short() == "tp1 z1"


def test_valid_ep_plan_passes():
    assert plan_problems(plan_with(ep_block=8), moe_model()) == []


@pytest.mark.parametrize("kwargs, field, words", [
    ({"ep_embed": 2}, "layers[0].ep", ["ep 2 on unit 'embed'", "no experts", "set ep: 1"]),
    ({"ep_block": 4, "devices": 6}, "layers[1].ep", ["ep 4 does not divide dp = 6", "1, 2, 3, 6"]),
    ({"ep_block": 16, "devices": 16}, "layers[1].ep", ["ep 16 does not divide the 8 experts", "1, 2, 4, 8"]),
    ({"ep_block": 2, "tp_block": 2}, "layers[1].ep", ["tp 2 with ep 2", "set tp: 1 or ep: 1"]),
])
def test_each_expert_rule_names_field_and_fix(kwargs, field, words):
    plan = plan_with(**kwargs)
    problems = [p for p in plan_rules(plan, ModelFacts.of_spec(moe_model())) if p[0].endswith(".ep")]
    assert len(problems) >= 1
    f, problem, fix = problems[0]
    assert any(f"{f}: {problem}" in text for text in plan_problems(plan, moe_model()))  # validate says the same
    assert f == f"pipelines[0].stages[0].{field}"
    for w in words:
        assert w in problem + " " + fix


def test_runtime_facts_without_experts_refuse_ep_as_a_dense_unit():
    """The runtime supplies ModelFacts itself; a unit it states no experts for is dense."""
    facts = ModelFacts(tuple(UnitFacts(n) for n in ("embed", "layers.0", "layers.1", "head")), 128, {"layers.0": 8})
    problems = [p for p in plan_rules(plan_with(ep_block=2), facts) if p[0].endswith(".ep")]
    assert len(problems) == 1 and "'layers.1'" in problems[0][1]


@pytest.mark.parametrize("value", [0, "two", True])
def test_bad_ep_in_a_file_names_the_entry(value):
    d = plan_to_dict(plan_with(ep_block=2))
    d["pipelines"][0]["stages"][0]["layers"][1]["ep"] = value
    with pytest.raises(AutoparError) as e:
        plan_from_dict(d)
    assert e.value.field == "pipelines[0].stages[0].layers[1].ep"



def test_validate_and_estimate_an_moe_plan_on_the_command_line(tmp_path, capsys):
    from autopar.cli import main

    path = mixtral_plan(tmp_path, ep=8)
    assert main(["validate", str(path)]) == 0
    assert "valid" in capsys.readouterr().out
    assert main(["estimate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "layers.0..layers.31 tp1 z1 ful ep8" in out and "predicted: step" in out
    assert main(["validate", str(mixtral_plan(tmp_path, ep=1))]) == 2  # the same plan without ep does not fit
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exceeds the budget 80.00 GiB" in err[0]


def test_validate_refuses_an_ep_not_dividing_the_experts_in_one_line(tmp_path, capsys):
    from autopar.cli import main

    text = mixtral_plan(tmp_path, ep=8).read_text().replace("ep: 8", "ep: 16")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ep 16 does not divide the 8 experts of unit 'layers.0'" in err[0]
    assert "pipelines[0].stages[0].layers[1].ep" in err[0]


@pytest.mark.parametrize("change, words", [
    ({"zero": 3, "reshard": False}, ["reshard: false with ep 4", "drop reshard"]),
    ({"zero": 1, "zero_overlap": True}, ["zero_overlap: true with ep 4", "drop zero_overlap"]),
    ({"zero": 1, "cp": 2}, ["cp 2 with ep 4", "set ep: 1"]),
])
def test_ep_with_an_option_it_is_not_priced_or_built_for_is_refused(change, words):
    """The MoE cost terms price plain ZeRO only, and the expert layout is over dp = devices / tp: an ep unit
    with reshard: false, zero_overlap or context parallel is refused naming the pair (validate and wrap)."""
    plan = plan_with(ep_block=4)
    for ly in plan.pipelines[0].stages[0].layers[1:3]:
        object.__setattr__(ly, "strategy", Strategy(tp=1, ep=4, **change))
    problems = [p for p in plan_rules(plan, ModelFacts.of_spec(moe_model())) if p[0].endswith(".ep")]
    assert problems, change
    f, problem, fix = problems[0]
    assert f == "pipelines[0].stages[0].layers[1].ep"
    for w in words:
        assert w in problem + " " + fix


def test_an_moe_unit_with_tp_needs_sequence_parallel():
    """Megatron-core's MoE layer raises in training with TP and without SP; torchtitan shards the tokens too."""
    plan = plan_with(ep_block=1, tp_block=2)
    problems = [p for p in plan_rules(plan, ModelFacts.of_spec(moe_model())) if p[0].endswith(".sp")]
    assert [p[0] for p in problems] == [f"pipelines[0].stages[0].layers[{i}].sp" for i in (1, 2)]
    assert "tp 2 without sequence parallel on unit 'layers.0'" in problems[0][1] and "set sp: true" in problems[0][2]
    assert not [p for p in plan_rules(plan, None) if p[0].endswith(".sp")]  # needs the model to know the experts


def test_a_unit_with_per_token_sublayers_needs_sequence_parallel_under_tp():
    """An MoE family's dense-first block under wrap (its MLP whole on every rank, moe_local): no experts, but TP
    divides its MLP's work only through the sequence (UnitFacts.tp_needs_sp, LayerSpec.tp_local_params)."""
    plan = plan_with(ep_block=1, tp_block=2)
    facts = ModelFacts.of_spec(moe_model())
    dense_first = ModelFacts(tuple(UnitFacts(u.name, u.has_tp_plan, u.tp_divisors, u.name.startswith("layers."))
                                   for u in facts.units))  # no experts named
    assert [p[0] for p in plan_rules(plan, dense_first) if p[0].endswith(".sp")] == \
        [f"pipelines[0].stages[0].layers[{i}].sp" for i in (1, 2)]
    plan_sp = plan_with(ep_block=1, tp_block=2)
    layers = plan_sp.pipelines[0].stages[0].layers
    layers[1:3] = [replace(ly, strategy=replace(ly.strategy, sp=True)) for ly in layers[1:3]]
    assert not [p for p in plan_rules(plan_sp, dense_first) if p[0].endswith(".sp")]
