"""``--max-tp`` / ``SearchOptions.max_tp``: the largest TP degree the planners and the Megatron baseline try. It bites
(the unconstrained plan uses more), the plan states it, and a Mixtral config, which wrap runs with tp 1, gets a
plan without tensor parallelism on every unit."""

from __future__ import annotations

import json

from autopar.cli import main
from autopar.cluster.parse import load_cluster
from autopar.modelspec import from_zoo
from autopar.search.options import SearchOptions
from autopar.search.run import search

MIXTRAL_8X7B = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2}


def _tps(plan) -> set[int]:
    return {ly.strategy.tp for pipe in plan.pipelines for st in pipe.stages for ly in st.layers}


def test_no_unit_gets_a_tp_degree_above_the_cap_and_the_plan_says_so():
    model, cluster = from_zoo("llama2-70b", seq_len=2048), load_cluster("2x8xA100-80G")
    free = search(model, cluster, 64, SearchOptions())
    assert max(_tps(free.plan)) > 2  # the cap below changes the plan
    capped = search(model, cluster, 64, SearchOptions(max_tp=2))
    assert max(_tps(capped.plan)) <= 2 and capped.plan.search["max_tp"] == 2
    assert capped.plan.search["pruned"].get("tp-above-max", 0) > 0
    megatron = capped.baselines.get("megatron")
    assert megatron is None or max(_tps(megatron[0])) <= 2


def test_the_heterogeneous_planner_keeps_the_cap():
    plan = search(from_zoo("llama2-7b", seq_len=2048), load_cluster("8xA100-80G+8xV100"), 64,
                  SearchOptions(max_tp=1)).plan
    assert _tps(plan) == {1} and plan.search["max_tp"] == 1


def test_a_mixtral_config_searched_with_max_tp_1_is_a_plan_wrap_runs(tmp_path, capsys):
    from autopar.plan.io import load_plan

    config, plan = tmp_path / "config.json", tmp_path / "plan.yaml"
    config.write_text(json.dumps(MIXTRAL_8X7B))
    args = ["search", "--model", str(config), "--cluster", "2x8xA100-80G", "--global-batch-size", "256",
            "--seq-len", "4096", "--no-baselines", "-o", str(plan)]
    assert main(args) == 0 and max(_tps(load_plan(str(plan)))) > 1
    assert main([*args, "--max-tp", "1"]) == 0 and _tps(load_plan(str(plan))) == {1}
    assert main(["validate", str(plan)]) == 0
