"""The validator: accepts valid homogeneous and asymmetric plans; one test per kind of rejection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from plan_testlib import A100, asym_plan, base_plan, model_spec, two_node_cluster, valid_plans

from autopar.cluster.cluster import Cluster, Node
from autopar.errors import AutoparError
from autopar.plan.schema import StageLayer, Strategy
from autopar.plan.validate import plan_problems, validate_plan


def test_valid_homogeneous_plan_passes_with_model_and_memory():
    plan = base_plan()
    assert plan_problems(plan) == []
    assert plan_problems(plan, model_spec(), {d: 79.9 for d in range(8)}) == []
    validate_plan(plan, model_spec(), {d: 80.0 for d in range(8)})  # exactly at the GPU's memory fits


def test_valid_asymmetric_plan_passes():
    plan = asym_plan()  # 2 pipelines: 2 stages on A100s, 1 stage on 3090s; budget 20 GiB
    assert len(plan.pipelines) > 1  # asymmetric: several pipelines
    assert plan_problems(plan, model_spec(), {d: 19.5 for d in range(6)}) == []


@settings(max_examples=40, deadline=None)
@given(valid_plans())
def test_generated_valid_plans_pass(plan):
    assert plan_problems(plan) == []


def _stage(plan, si, pi=0):
    return plan.pipelines[pi].stages[si]


def _names(plan, si, pi=0):
    return _stage(plan, si, pi).layer_names


def _move(plan, names_by_stage):
    """Rewrite stage layer lists (by name) keeping each unit's strategy."""
    strat = {ly.name: ly.strategy for st in plan.pipelines[0].stages for ly in st.layers}
    for si, names in enumerate(names_by_stage):
        _stage(plan, si).layers = [StageLayer(n, strat.get(n, Strategy())) for n in names]


def _problem(plan, model=True, memory=None):
    problems = plan_problems(plan, model_spec() if model else None, memory)
    assert problems, "the validator accepted a bad plan"
    with pytest.raises(AutoparError) as err:
        validate_plan(plan, model_spec() if model else None, memory)
    assert str(err.value) == problems[0] and "\n" not in problems[0]
    return problems


def test_layer_missing():
    plan = base_plan()
    _move(plan, [_names(plan, 0), ["layers.3", "layers.5", "head"]])
    problems = _problem(plan)
    assert problems == ["pipelines[0]: does not place layer unit(s) layers.4; add them to the stage that holds "
                        "their neighbours, in model order"]


def test_layer_placed_twice():
    plan = base_plan()
    _move(plan, [_names(plan, 0) + ["layers.3"], _names(plan, 1)])
    problems = _problem(plan)
    assert problems == ["pipelines[0].stages[1].layers[0].name: 'layers.3' is placed twice in pipeline 0 (also at "
                        "pipelines[0].stages[0].layers[4]); place each layer unit exactly once per pipeline"]


def test_layers_out_of_order_inside_a_stage():
    plan = base_plan()
    _move(plan, [_names(plan, 0), ["layers.4", "layers.3", "layers.5", "head"]])
    [p] = _problem(plan)
    assert p.startswith("pipelines[0].stages[1].layers[1].name: 'layers.3' comes after 'layers.4'")


def test_stages_not_contiguous():
    plan = base_plan()  # stage 0 skips layers.2, which stage 1 then holds: stage 1 does not continue stage 0
    _move(plan, [["embed", "layers.0", "layers.1", "layers.3"], ["layers.2", "layers.4", "layers.5", "head"]])
    [p] = _problem(plan)
    assert p.startswith("pipelines[0].stages[1].layers[0].name: 'layers.2' comes after 'layers.3', against model")


def test_unknown_unit():
    plan = base_plan()
    _stage(plan, 1).layers[-1] = StageLayer("lm_head", Strategy())
    problems = _problem(plan)
    assert problems[0].startswith("pipelines[0].stages[1].layers[3].name: 'lm_head' is not a layer unit of the model")
    assert "does not place layer unit(s) head" in problems[1]


def test_without_model_pipelines_must_agree_and_count_matches():
    plan = asym_plan()
    plan.pipelines[1].stages[0].layers.pop(3)
    [p] = _problem(plan, model=False)
    assert p.startswith("pipelines[1]: does not place layer unit(s) layers.2")
    plan = base_plan()
    plan.model.num_layers = 9
    [p] = _problem(plan, model=False)
    assert p.startswith("model.layers: is 9 but the plan places 8 distinct layer units")
    plan = base_plan()
    _move(plan, [_names(plan, 0) + ["layers.2"], _names(plan, 1)])
    assert "is placed twice" in _problem(plan, model=False)[0]


def test_model_mismatch():
    plan = base_plan()
    plan.model.seq_len = 4096
    [p] = _problem(plan)
    assert p.startswith("model.seq_len: plan is for sequence length 4096, the model uses 128")


def test_empty_stage():
    plan = base_plan()
    _stage(plan, 1).layers = []
    problems = _problem(plan)
    assert problems[0] == "pipelines[0].stages[1].layers: is empty; give the stage layer units or remove the stage"
    plan = base_plan()
    plan.cluster = Cluster(nodes=[Node(A100, 4)])
    _stage(plan, 1).devices = []
    assert _problem(plan)[0].startswith("pipelines[0].stages[1].devices: is empty")


def test_duplicate_device():
    plan = base_plan()
    _stage(plan, 1).devices = [3, 5, 6, 7]
    problems = _problem(plan)
    assert problems[0] == ("pipelines[0].stages[1].devices[0]: device 3 is used twice (also at "
                           "pipelines[0].stages[0].devices[3]); give every device to exactly one stage")
    assert "unused: 4" in problems[1]


def test_device_out_of_range():
    plan = base_plan()
    _stage(plan, 1).devices = [4, 5, 6, 8]
    problems = _problem(plan)
    assert problems[0].startswith("pipelines[0].stages[1].devices[3]: device 8 is outside the cluster (devices 0-7)")


def test_world_size_must_match_the_cluster():
    plan = base_plan()
    plan.cluster = Cluster(nodes=[Node(A100, 4)] * 3)
    [p] = _problem(plan)
    assert p.startswith("pipelines: the plan uses 8 of the cluster's 12 devices (unused: 8-11)")


def test_tp_not_dividing_the_stage():
    plan = base_plan()
    _stage(plan, 1).layers[0] = StageLayer("layers.3", Strategy(tp=3))
    problems = _problem(plan, model=False)
    assert problems == ["pipelines[0].stages[1].layers[0].tp: tp 3 does not divide the stage's 4 devices; use a "
                        "divisor of 4 (1, 2, 4)"]


def test_tp_group_across_nodes():
    plan = base_plan()
    _stage(plan, 0).devices, _stage(plan, 1).devices = [0, 1, 4, 5], [2, 3, 6, 7]
    problems = _problem(plan)  # stage 0's tp 2 groups [0, 1] and [4, 5] are fine; stage 1's tp 4 is not
    assert problems == [
        f"pipelines[0].stages[1].layers[{i}].tp: TP group [2, 3, 6, 7] spans nodes [0, 1]; keep each TP group "
        "inside one node: a smaller tp, or reorder the stage's devices node by node" for i in range(3)]


def test_tp_illegal_for_the_unit():
    plan = base_plan()
    _stage(plan, 1).layers[-1] = StageLayer("head", Strategy(tp=2))  # head has no TP plan
    [p] = _problem(plan)
    assert p.startswith("pipelines[0].stages[1].layers[3].tp: tp 2 is not legal for unit 'head' (it has no TP plan)")
    plan = base_plan()
    plan.cluster = Cluster(nodes=[Node(A100, 8)])
    _stage(plan, 0).devices, _stage(plan, 1).devices = list(range(4)), list(range(4, 8))
    plan.pipelines[0].stages = [plan.pipelines[0].stages[0]]
    _stage(plan, 0).devices = list(range(8))
    _stage(plan, 0).layers = [StageLayer(n, Strategy(tp=8 if n.startswith("layers") else 1)) for n in
                              ["embed"] + [f"layers.{i}" for i in range(6)] + ["head"]]
    plan.pipelines[0].micro_batch_size, plan.pipelines[0].num_microbatches = 8, 4
    problems = _problem(plan)
    assert problems[0].startswith("pipelines[0].stages[0].layers[1].tp: tp 8 is not legal for unit 'layers.0' "
                                  "(its TP limits are [8, 4, 1024]; tp must divide each); use tp 1, 2 or 4 ")
    assert len(problems) == 6  # one per block


def test_dp_not_dividing_the_micro_batch():
    plan = base_plan()
    p = plan.pipelines[0]
    p.micro_batch_size, p.num_microbatches = 2, 16  # embed has dp 4 on its 4 devices
    problems = _problem(plan)
    assert problems[0] == ("pipelines[0].stages[0].layers[0].tp: dp = 4 devices / tp 1 = 4 does not divide "
                           "micro_batch_size 2 of pipeline 0; make micro_batch_size a multiple of 4, or raise tp")
    assert len(problems) == 2  # embed (stage 0) and head (stage 1); the tp 2 / tp 4 layers have dp 2 / 1


def test_batch_shares_not_summing_to_the_global_batch():
    plan = asym_plan()
    plan.global_batch_size = 40
    [p] = _problem(plan)
    assert p == ("pipelines[*].batch_share: shares [24, 8] sum to 32, not the global batch 40; make the pipelines' "
                 "batch shares add up to global_batch_size")


def test_batch_share_not_mbs_times_microbatches():
    plan = base_plan()
    plan.pipelines[0].num_microbatches = 7
    [p] = _problem(plan)
    assert p == ("pipelines[0].batch_share: is 32 but micro_batch_size x num_microbatches = 4 x 7 = 28; make "
                 "batch_share = micro_batch_size * num_microbatches")


def test_unknown_schedule():
    plan = base_plan()
    plan.schedule = "zero-bubble"  # set after construction: the schema checks only at __init__
    [p] = _problem(plan)
    assert p.startswith("schedule: unknown schedule 'zero-bubble'; use one of 1f1b, gpipe")


def test_memory_over_the_gpu():
    plan = base_plan()
    peaks = {d: 60.0 for d in range(8)} | {5: 81.5}
    [p] = _problem(plan, memory=peaks)
    assert p == ("pipelines[0].stages[1] (device 5): predicted peak memory 81.50 GiB exceeds the budget 80.00 GiB "
                 "(A100-80G memory); raise zero or ckpt, lower micro_batch_size, or use more stages")


def test_memory_over_the_budget():
    plan = asym_plan()  # budget 20 GiB
    problems = _problem(plan, memory={0: 19.0, 4: 20.5, 5: 23.0})
    assert len(problems) == 2
    assert problems[0].startswith("pipelines[1].stages[0] (device 4): predicted peak memory 20.50 GiB exceeds the "
                                  "budget 20.00 GiB (memory_budget_gib)")


def test_a_budget_above_the_gpu_does_not_lend_it_memory():
    # the validator, the estimate's fits and the search share Cluster.budget_gib: the smaller of the two
    plan = base_plan()
    plan.memory_budget_gib = 200.0
    [p] = _problem(plan, memory={d: 60.0 for d in range(8)} | {5: 81.5})
    assert "exceeds the budget 80.00 GiB (A100-80G memory)" in p
    assert plan.cluster.budget_gib(5, 200.0) == plan.cluster.budget_gib(5) == 80.0
    assert plan.cluster.budget_gib(5, 20.0) == 20.0


def test_all_problems_are_listed_not_just_the_first():
    plan = base_plan()
    plan.pipelines[0].num_microbatches = 7
    plan.global_batch_size = 33
    _stage(plan, 1).layers[-1] = StageLayer("head", Strategy(tp=2))
    fields = [p.split(":")[0] for p in plan_problems(plan, model_spec(), {0: 100.0})]
    assert fields == ["pipelines[0].batch_share", "pipelines[*].batch_share", "pipelines[0].stages[1].layers[3].tp",
                      "pipelines[0].stages[0] (device 0)"]


def test_two_node_cluster_helper_is_what_base_plan_uses():
    assert base_plan().cluster == two_node_cluster()
