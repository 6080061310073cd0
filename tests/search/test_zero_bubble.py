"""The zero-bubble schedule (zb-h1) in the homogeneous search (autopar/search/zero_bubble.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.estimate import estimate_plan
from autopar.plan.schema import Pipeline
from autopar.plan.validate import plan_problems
from autopar.search import SearchOptions, search
from tests.search.tiny import gpt_like

GPU = GPUType("small", memory_gib=8, tflops=50.0, hbm_gbps=500.0, nvlink_gbps=100.0)


def _cluster(n: int) -> Cluster:
    return Cluster([Node(GPU, 1, name=f"n{i}") for i in range(n)], inter_bw_gbps=100.0, inter_lat_us=5.0, name="x")


@pytest.mark.parametrize("blocks,pp,gbs", [(8, 4, 8), (16, 8, 16)])
def test_deep_pipelines_pick_zb_h1_over_every_1f1b_setting(blocks, pp, gbs):
    """pp fixed, interleaving off: the bubble dominates, so the search returns a zb-h1 plan that the rules
    accept, that estimates to the figure the search optimised and beats every 1F1B setting it scored."""
    model = gpt_like(blocks=blocks)
    res = search(model, _cluster(pp), gbs, SearchOptions(pp_degrees=[pp], virtual_stages=()))
    plan = res.plan
    assert plan.schedule == "zb-h1" and plan.pipelines[0].num_stages == pp
    assert plan_problems(plan, model) == []
    assert estimate_plan(plan, model).step_time_s == pytest.approx(res.estimate.step_time_s, rel=1e-12)
    plain = [c.step_time for c in res.configs if c.stages and not c.schedule]
    assert plain and res.estimate.step_time_s < min(plain)
    tried = [c for c in res.configs if c.schedule == "zb-h1"]
    assert 1 <= len(tried) <= 3 and any(c.step_time == res.estimate.step_time_s for c in tried)


@pytest.mark.parametrize("budget,winner", [(None, "zb-h1"), (1.3, "zb-h1"), (1.22, "1f1b")])
def test_zb_candidates_hold_their_activations_within_the_budget(budget, winner):
    """Tighter budgets: zb-h1 holds min(p, m) micro-batches on every stage, so its candidates are re-picked
    by the DP (slower strategies) and each still fits at its recorded step time; at 1.22 GiB they are
    slower than the best 1F1B plan, which the search keeps."""
    model = gpt_like(blocks=8)
    res = search(model, _cluster(4), 16, SearchOptions(memory_budget_gib=budget, virtual_stages=(), pp_degrees=[4]))
    assert res.plan.schedule == winner
    tried = [c for c in res.configs if c.schedule == "zb-h1" and c.stages]
    assert tried
    for c in tried:
        plan = replace(res.plan, schedule="zb-h1", pipelines=[Pipeline(16, c.micro_batch_size, c.num_microbatches,
                                                                       c.stages)])
        est = estimate_plan(plan, model)
        assert est.fits and est.step_time_s == pytest.approx(c.step_time, rel=1e-12)
        assert plan_problems(plan, model) == []
    best_zb = min(c.step_time for c in tried)
    assert res.estimate.step_time_s == best_zb if winner == "zb-h1" else res.estimate.step_time_s < best_zb


def test_zero_bubble_off_and_gpipe_searches_try_none():
    for opts in (SearchOptions(pp_degrees=[4], zero_bubble=False), SearchOptions(pp_degrees=[4], schedule="gpipe")):
        res = search(gpt_like(blocks=8), _cluster(4), 8, opts)
        assert res.plan.schedule != "zb-h1" and not any(c.schedule for c in res.configs)


@pytest.mark.parametrize("budget_gib,inter_gbps", [(None, 5.0), (0.3, 5.0), (0.12, 5.0), (None, 0.05)])
def test_trying_zb_h1_never_makes_the_plan_slower(budget_gib, inter_gbps):
    """On the brute-force cases (tests/search/test_bruteforce.py): with zb-h1 tried, the plan is the exact
    1F1B optimum or a faster zb-h1 plan that fits."""
    from tests.search.test_bruteforce import PARAMS, small_cluster

    model, cluster = gpt_like(blocks=2), small_cluster(inter_gbps=inter_gbps)
    off = search(model, cluster, 8, SearchOptions(memory_budget_gib=budget_gib, params=PARAMS, zero_bubble=False),
                 with_baselines=False)
    on = search(model, cluster, 8, SearchOptions(memory_budget_gib=budget_gib, params=PARAMS), with_baselines=False)
    assert on.estimate.step_time_s <= off.estimate.step_time_s and on.estimate.fits
    assert (on.plan.schedule == "zb-h1") == (on.estimate.step_time_s < off.estimate.step_time_s)
