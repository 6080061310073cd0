"""The frontier DP's reference filter (``pareto_with_reference``) is exact: the same frontier, in the same
order, as sorting every point (``pareto_by_group``), ties and rounding included; and a search with it
returns the very plan, figures and candidate count of a search without it."""

import numpy as np
import pytest

from autopar.cluster.parse import load_cluster
from autopar.plan.io import plan_to_dict
from autopar.search import SearchOptions, frontier, search
from autopar.search.frontier import pareto_by_group, pareto_with_reference
from cost_models import CostParams
from tests.search.tiny import gpt_like, small_cluster


def _points(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 500))
    groups = rng.integers(0, 4, n)
    # Coarse values give ties in memory, in time and in both; ulp-sized offsets give near-ties that the
    # whole-set shift of pareto_by_group can round together.
    mem = rng.integers(0, 25, n).astype(float) * 2.0**30 + rng.integers(0, 3, n) * np.spacing(2.0**35)
    base = rng.choice([0.5, 3.0, 900.0])
    time = base + rng.integers(0, 25, n) * 0.01 * base + rng.integers(0, 3, n) * np.spacing(base * 2)
    ref = rng.random(n) < rng.random()
    return groups, mem, time, ref


@pytest.mark.parametrize("seed", range(40))
def test_the_reference_filter_keeps_exactly_the_frontier(seed):
    groups, mem, time, ref = _points(seed)
    want = pareto_by_group(groups, mem, time)
    got = pareto_with_reference(groups, mem, time, ref)
    assert np.array_equal(got, want)
    assert np.array_equal(pareto_with_reference(groups, mem, time, np.ones_like(ref)), want)


def test_the_filter_drops_points_before_the_sort(monkeypatch):
    """Not a no-op: on a frontier-shaped set the points the reference dominates never reach the final sort."""
    x = np.linspace(0.0, 1.0, 200)
    groups = np.zeros(400, dtype=int)
    mem = np.r_[x, x + 0.001]
    time = np.r_[1.0 - x, 1.5 - x]  # the second half is dominated by the first
    sorted_sizes = []
    real = frontier.pareto_by_group
    monkeypatch.setattr(frontier, "pareto_by_group", lambda g, *a, **k: sorted_sizes.append(len(g)) or real(g, *a, **k))
    keep = pareto_with_reference(groups, mem, time, np.r_[np.ones(200, bool), np.zeros(200, bool)])
    assert np.array_equal(keep, np.arange(200))
    assert sorted_sizes == [200, 200]


PARAMS = CostParams(reserve_gib=0.0)
CASES = [
    (gpt_like(blocks=4), small_cluster(2, 2), 8, {"params": PARAMS}),
    (gpt_like(blocks=6), small_cluster(2, 4), 16, {"params": PARAMS, "schedule": "gpipe"}),
    ("llama2-13b", "2x8xA100-80G", 64, {}),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_search_with_the_filter_is_the_search_without_it(case, monkeypatch):
    model, cluster, B, opts = CASES[case]
    if isinstance(model, str):
        from autopar.modelspec.zoo import from_zoo
        model, cluster = from_zoo(model), load_cluster(cluster)
    fast = search(model, cluster, B, SearchOptions(**opts), with_baselines=False)
    monkeypatch.setattr(frontier, "pareto_with_reference", lambda g, m, t, ref: pareto_by_group(g, m, t))
    plain = search(model, cluster, B, SearchOptions(**opts), with_baselines=False)
    for r in (fast, plain):
        r.plan.search.pop("seconds")
    assert plan_to_dict(fast.plan) == plan_to_dict(plain.plan)
    assert fast.estimate.step_time_s == plain.estimate.step_time_s
    assert fast.candidates == plain.candidates and fast.pruned == plain.pruned
