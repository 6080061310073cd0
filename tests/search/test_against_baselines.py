"""On real zoo models and clusters the searched plan is never worse than a baseline, always fits,
always validates, and its estimate is the number the search optimised."""

import pytest

from autopar.cluster.parse import load_cluster
from autopar.estimate import estimate_plan
from autopar.modelspec.zoo import from_zoo
from autopar.plan.validate import validate_plan
from autopar.search import SearchOptions, search

CASES = [
    ("llama2-7b", "8xA100-80G", 64, 4096, None),
    ("llama2-7b", "2x8xA100-80G", 64, 4096, 40.0),
    ("gpt3-1.3b", "2x8xV100-32G", 128, 2048, None),
    ("llama3-8b", "2x8xRTX4090", 32, 2048, None),
    ("bert-large", "4xA100-40G", 256, 512, None),
    ("gpt3-13b", "4x8xA100-80G", 256, 2048, None),
]


@pytest.mark.parametrize("model,cluster,B,seq,budget", CASES)
def test_search_beats_or_ties_every_fitting_baseline(model, cluster, B, seq, budget):
    m, c = from_zoo(model, seq), load_cluster(cluster)
    opts = SearchOptions(memory_budget_gib=budget)
    res = search(m, c, B, opts)
    est = estimate_plan(res.plan, m, opts.params)
    assert est.step_time_s == res.estimate.step_time_s
    assert est.fits
    validate_plan(res.plan, m, est.memory_gib)
    for name, v in res.baselines.items():
        if v is None:
            continue
        plan, best = v
        assert best.fits, name
        assert res.estimate.step_time_s <= best.step_time_s * (1 + 1e-12), name


def test_gpipe_needs_more_memory_than_1f1b_for_the_same_plan():
    m, c = from_zoo("llama2-7b", 4096), load_cluster("2x8xA100-80G")
    # A gpipe search (a 1f1b one may return an interleaved plan, which is not the same plan under gpipe).
    res = search(m, c, 64, SearchOptions(pp_degrees=[4], num_microbatches=[16], schedule="gpipe"),
                 with_baselines=False)
    plan = res.plan
    plan.schedule = "1f1b"
    one = estimate_plan(plan, m)
    assert res.estimate.max_memory_gib > one.max_memory_gib
    assert one.step_time_s == pytest.approx(res.estimate.step_time_s)


def test_time_budget_returns_best_so_far():
    m, c = from_zoo("gpt3-13b", 2048), load_cluster("4x8xA100-80G")
    res = search(m, c, 256, SearchOptions(time_budget_s=1e-6), with_baselines=False)
    assert res.timed_out and res.plan.stages
