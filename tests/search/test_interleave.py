"""Interleaved re-cuts in the homogeneous search (autopar/search/interleave.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.plan.validate import plan_problems
from autopar.search import SearchOptions, search
from autopar.search.interleave import balanced_cuts, stage_equivalents
from tests.search.tiny import gpt_like

GPU = GPUType("small", memory_gib=8, tflops=50.0, hbm_gbps=500.0, nvlink_gbps=100.0)


def _cluster(n: int) -> Cluster:
    return Cluster([Node(GPU, 1, name=f"n{i}") for i in range(n)], inter_bw_gbps=100.0, inter_lat_us=5.0, name="x")


def _brute_force(costs: list[float], parts: int) -> float:
    n = len(costs)
    best = float("inf")
    for inner in itertools.combinations(range(1, n), parts - 1):
        cuts = [0, *inner, n]
        best = min(best, max(sum(costs[a:b]) for a, b in zip(cuts, cuts[1:])))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_balanced_cuts_are_the_least_largest_chunk(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    costs = [rng.choice([0.0, rng.uniform(0.1, 5.0)]) for _ in range(n)]
    parts = rng.randint(1, n)
    cuts = balanced_cuts(costs, parts)
    assert len(cuts) == parts + 1 and cuts[0] == 0 and cuts[-1] == n
    assert all(a < b for a, b in zip(cuts, cuts[1:])), "every chunk holds a unit"
    worst = max(sum(costs[a:b]) for a, b in zip(cuts, cuts[1:]))
    assert worst == pytest.approx(_brute_force(costs, parts), rel=1e-9, abs=1e-12)


def test_stage_equivalents_are_the_tables_peaks_in_stages_worth():
    assert stage_equivalents(4, 8, 2) == [5.5, 4.5, 3.5, 2.5]  # Megatron: p (1 + (p - 1) / (p v)) on stage 0
    assert stage_equivalents(2, 2, 2) == [2.0, 1.5]


@pytest.mark.parametrize("blocks,pp,gbs", [(8, 4, 8), (14, 4, 8), (16, 8, 8)])
def test_few_micro_batches_on_deep_pipelines_pick_an_interleaved_plan(blocks, pp, gbs):
    """With pp fixed and few micro-batches the bubble dominates: the search returns an interleaved plan that
    the rules accept, that estimates to the figure the search optimised, and that beats every 1F1B setting."""
    model = gpt_like(blocks=blocks)
    res = search(model, _cluster(pp), gbs, SearchOptions(pp_degrees=[pp], zero_bubble=False))
    plan, pipe = res.plan, res.plan.pipelines[0]
    assert plan.schedule == "interleaved" and pipe.virtual_stages > 1 and pipe.num_stages == pp
    assert plan_problems(plan, model) == []
    assert estimate_plan(plan, model).step_time_s == pytest.approx(res.estimate.step_time_s, rel=1e-12)
    plain = [c.step_time for c in res.configs if c.stages and c.virtual_stages == 1]
    assert plain and res.estimate.step_time_s < min(plain)
    tried = [c for c in res.configs if c.virtual_stages > 1]
    assert any(c.virtual_stages == pipe.virtual_stages and c.step_time == res.estimate.step_time_s for c in tried)


def test_gpipe_searches_try_no_interleaving():
    res = search(gpt_like(blocks=8), _cluster(4), 8, SearchOptions(pp_degrees=[4], schedule="gpipe"))
    assert res.plan.schedule == "gpipe" and all(c.virtual_stages == 1 for c in res.configs)


def test_the_interleaved_schedule_is_not_a_search_option():
    with pytest.raises(AutoparError, match="the search takes schedule 1f1b or gpipe"):
        SearchOptions(schedule="interleaved")


def test_no_virtual_stages_tries_no_interleaving_and_bad_counts_are_refused():
    res = search(gpt_like(blocks=8), _cluster(4), 8, SearchOptions(pp_degrees=[4], virtual_stages=(), zero_bubble=False))
    assert res.plan.schedule == "1f1b" and all(c.virtual_stages == 1 for c in res.configs)
    with pytest.raises(AutoparError, match="virtual_stages: must be counts >= 2"):
        SearchOptions(virtual_stages=(1,))
