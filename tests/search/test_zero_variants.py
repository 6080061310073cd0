"""The sharding options in the search space: ZeRO-3 with and without resharding after forward, ZeRO-1/2 with
and without zero_overlap (``Rule.ZERO_OVERLAP_DOMINATES`` keeps the one that can win), and searches that pick
``reshard: false`` under memory headroom only."""

from collections import Counter
from dataclasses import replace

import pytest
import yaml

from autopar.estimate import estimate_plan
from autopar.plan.io import dump_plan_yaml, plan_from_dict
from autopar.plan.schema import Strategy
from autopar.plan.validate import plan_problems
from autopar.search import SearchOptions, search
from autopar.search.rules import Rule
from autopar.search.zero_variants import overlap_choice, zero_variants
from cost_models import CostParams
from tests.search.hetero.hetlib import PARAMS
from tests.search.tiny import gpt_like, small_cluster


@pytest.mark.parametrize("fields,choice", [({}, True), ({"overlap_sync": 0.5}, None),
                                           ({"overlap_grad_reduce": 0.0, "overlap_param_gather": 0.0}, False),
                                           ({"overlap_sync": 0.5, "overlap_grad_reduce": 0.0,
                                             "overlap_param_gather": 0.0}, False)])
def test_which_zero_overlap_variant_can_win(fields, choice):
    assert overlap_choice(CostParams(**fields)) is choice


def test_variants_and_their_count():
    pruned: Counter = Counter()
    assert zero_variants(Strategy(zero=3, ckpt="full"), CostParams(), pruned) == [
        Strategy(zero=3, ckpt="full"), Strategy(zero=3, ckpt="full", reshard=False)]
    assert zero_variants(Strategy(zero=1), CostParams(), pruned) == [Strategy(zero=1, zero_overlap=True)]
    assert zero_variants(Strategy(zero=2), CostParams(overlap_sync=0.3), pruned) == [
        Strategy(zero=2), Strategy(zero=2, zero_overlap=True)]
    assert zero_variants(Strategy(zero=0), CostParams(), pruned) == [Strategy(zero=0)]
    assert pruned == {Rule.ZERO_OVERLAP_DOMINATES: 1}


def _search(params: CostParams, budget: float | None):
    model = gpt_like(blocks=4)
    res = search(model, small_cluster(1, 4), 16, SearchOptions(params=params, memory_budget_gib=budget, pp_degrees=[1]),
                 with_baselines=False)
    strategies = [ly.strategy for st in res.plan.stages for ly in st.layers]
    return model, res, strategies


def test_default_search_overlaps_every_zero1_and_zero2_unit():
    model, res, strategies = _search(PARAMS, None)
    assert any(s.zero in (1, 2) for s in strategies)
    assert all(s.zero_overlap for s in strategies if s.zero in (1, 2))
    assert res.pruned[Rule.ZERO_OVERLAP_DOMINATES.value] > 0
    again = plan_from_dict(yaml.safe_load(dump_plan_yaml(res.plan)))
    assert again.pipelines == res.plan.pipelines
    assert estimate_plan(again, model, PARAMS).step_time_s == pytest.approx(res.estimate.step_time_s, rel=1e-12)


def test_no_reshard_is_chosen_under_headroom_only():
    """A runtime whose ZeRO-2 holds full gradients (measured state_table) and whose FSDP prefetch hides nothing
    (overlap_zero3 0): FSDP without resharding sits between ZeRO-3 and ZeRO-1 in memory and is faster than
    ZeRO-3, so it wins where memory allows more than ZeRO-3 but not ZeRO-1 everywhere; a tight budget leaves
    it out. Async TP hides nothing here (async_tp_overlap 0), so it is never chosen and cannot shift the
    memory that decides."""
    params = replace(PARAMS, overlap_zero3=0.0, async_tp_overlap=0.0, state_table=((18, 0), (6, 12), (6, 12), (0, 18)))
    model, res, strategies = _search(params, 0.3)
    assert any(s.zero == 3 and not s.reshard for s in strategies)
    assert plan_problems(res.plan, model, res.estimate.memory_gib) == []
    _, tight, tight_strategies = _search(params, 0.15)
    assert all(s.reshard for s in tight_strategies) and any(s.zero == 3 for s in tight_strategies)
    assert tight.estimate.step_time_s > res.estimate.step_time_s
