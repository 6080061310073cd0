"""Expert parallelism in the search: ep is in the space of MoE units only (degrees dividing dp and the experts),
and on an MoE model the search picks ep > 1, which the same plan without it pays for in memory and time."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace

import pytest

from autopar.cluster.parse import load_cluster
from autopar.estimate import StageContext, estimate_plan
from autopar.modelspec import from_zoo
from autopar.modelspec.hf import entry_from_hf_config
from autopar.modelspec.zoo import spec_from_entry
from autopar.plan.schema import StageLayer
from autopar.plan.validate import plan_problems
from autopar.search.options import SearchOptions
from autopar.search.run import search
from autopar.search.space import enumerate_strategies, tp_degrees

CFG = {"model_type": "mixtral", "vocab_size": 1024, "hidden_size": 1024, "intermediate_size": 4096,
       "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8, "num_local_experts": 16,
       "num_experts_per_tok": 2, "max_position_embeddings": 256}


def moe_model():
    """A 4-block Mixtral-like model with units without a TP plan (as a traced HF Mixtral's)."""
    m = spec_from_entry(entry_from_hf_config(CFG, "moe-test"), seq_len=256)
    m.layers = [replace(ly, tp_divisors=()) for ly in m.layers]
    return m


def test_ep_is_enumerated_for_moe_units_only():
    cluster = load_cluster("8xA100-80G")
    ctx = StageContext(cluster, tuple(range(8)), 8, 4)
    moe = moe_model().layer("layers.0")
    eps = Counter(s.ep for s in enumerate_strategies(moe, ctx, tp_degrees(ctx, Counter()), Counter()))
    assert set(eps) == {1, 2, 4, 8}  # divisors of dp 8 that divide 16 experts
    dense = from_zoo("llama2-7b", seq_len=256).layer("layers.0")
    assert {s.ep for s in enumerate_strategies(dense, ctx, tp_degrees(ctx, Counter()), Counter())} == {1}
    six = StageContext(load_cluster("6xA100-80G"), tuple(range(6)), 6, 4)
    assert {s.ep for s in enumerate_strategies(moe, six, tp_degrees(six, Counter()), Counter())} == {1, 2}


@pytest.mark.parametrize("budget", [None, 3.6])
def test_search_picks_expert_parallel_and_the_plan_needs_it(budget):
    model, cluster = moe_model(), load_cluster("8xA100-80G")
    res = search(model, cluster, 16, SearchOptions(memory_budget_gib=budget), with_baselines=False)
    placed = [ly for st in res.plan.stages for ly in st.layers]
    moe_units = [ly for ly in placed if model.layer(ly.name).moe is not None]
    assert moe_units and all(ly.strategy.ep > 1 for ly in moe_units)
    assert all(ly.strategy.ep == 1 for ly in placed if model.layer(ly.name).moe is None)
    est = estimate_plan(res.plan, model)
    assert plan_problems(res.plan, model, est.memory_gib) == []
    if budget is not None:
        assert max(est.memory_gib.values()) <= budget
    plain = copy.deepcopy(res.plan)
    for st in plain.stages:
        st.layers = [StageLayer(ly.name, replace(ly.strategy, ep=1)) for ly in st.layers]
    slow = estimate_plan(plain, model)
    assert max(slow.memory_gib.values()) > max(est.memory_gib.values())  # ZeRO-3 gathers every expert
    assert slow.step_time_s > 2 * est.step_time_s
