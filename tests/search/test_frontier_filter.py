"""The frontier DP's reference filter (``product_frontier``) is exact: the same frontier, in the same
order, as sorting every point (``pareto_by_group``), ties and rounding included; and a search with it
returns the very plan, figures and candidate count of a search without it."""

import numpy as np
import pytest

from autopar.cluster.parse import load_cluster
from autopar.plan.io import plan_to_dict
from autopar.search import SearchOptions, frontier, search
from autopar.search.frontier import pareto_by_group, product_frontier
from cost_models import CostParams
from tests.search.tiny import gpt_like, small_cluster


def _product(seed: int):
    rng = np.random.default_rng(seed)
    P, S = int(rng.integers(1, 60)), int(rng.integers(1, 9))
    # Coarse values give ties in memory, in time and in both; ulp-sized offsets give near-ties that the
    # whole-set shift of pareto_by_group can round together.
    M = rng.integers(0, 25, (P, S)).astype(float) * 2.0**30 + rng.integers(0, 3, (P, S)) * np.spacing(2.0**35)
    base = rng.choice([0.5, 3.0, 900.0])
    T = base + rng.integers(0, 25, (P, S)) * 0.01 * base + rng.integers(0, 3, (P, S)) * np.spacing(base * 2)
    row_layout, col_layout = rng.integers(0, 3, P), rng.integers(0, 3, S)
    cap = float(rng.choice([np.inf, np.median(M)]))
    return T, M, row_layout, col_layout, cap


def _plain(T, M, col_layout, cap):
    """Every point within the cap, in flat order, through pareto_by_group: what the DP did before."""
    ok = np.flatnonzero(M.ravel() <= cap)
    return ok[pareto_by_group(col_layout[ok % T.shape[1]], M.ravel()[ok], T.ravel()[ok])]


@pytest.mark.parametrize("seed", range(60))
def test_the_product_frontier_is_exactly_the_plain_frontier(seed):
    T, M, row_layout, col_layout, cap = _product(seed)
    assert np.array_equal(product_frontier(T, M, row_layout, col_layout, cap), _plain(T, M, col_layout, cap))


def test_the_reference_drops_points_before_the_sort(monkeypatch):
    """Not a no-op: the points the no-switch rows dominate never reach the final sort."""
    x = np.linspace(0.0, 1.0, 200)
    M = np.c_[np.r_[x, x + 0.001]]
    T = np.c_[np.r_[1.0 - x, 1.5 - x]]  # rows 200.. (another layout's parents, a switch paid) are dominated
    rows = np.r_[np.zeros(200, int), np.ones(200, int)]
    sorted_sizes = []
    real = frontier.pareto_by_group
    monkeypatch.setattr(frontier, "pareto_by_group", lambda g, *a, **k: sorted_sizes.append(len(g)) or real(g, *a, **k))
    keep = product_frontier(T, M, rows, np.zeros(1, int), np.inf)
    assert np.array_equal(keep, np.arange(200))
    assert sorted_sizes == [200]  # the final sort sees only the 200 survivors of 400


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
    monkeypatch.setattr(frontier, "product_frontier", lambda T, M, rows, cols, cap: _plain(T, M, cols, cap))
    plain = search(model, cluster, B, SearchOptions(**opts), with_baselines=False)
    for r in (fast, plain):
        r.plan.search.pop("seconds")
    assert plan_to_dict(fast.plan) == plan_to_dict(plain.plan)
    assert fast.estimate.step_time_s == plain.estimate.step_time_s
    assert fast.candidates == plain.candidates and fast.pruned == plain.pruned
