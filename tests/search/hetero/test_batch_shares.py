"""Batch shares: positive, multiples of each pipeline's micro-batch size, summing to the global batch,
and (for allocate) the least bottleneck any integer split can reach."""

import itertools
import random

import pytest

from autopar.search.hetero.batch_shares import PipelineRate, allocate, proportional


@pytest.mark.parametrize("total,weights,granule", [(64, [1, 2, 5], [1, 1, 1]), (256, [3.5, 1.0], [8, 4]),
                                                   (7, [1, 1, 1], [1, 2, 2]), (100, [0.1, 10, 5, 1], [4, 2, 2, 2])])
def test_proportional_sums_to_total(total, weights, granule):
    shares = proportional(total, weights, granule)
    assert sum(shares) == total
    assert all(s >= g and s % g == 0 for s, g in zip(shares, granule))
    # the fastest gets the most where granules allow
    if granule == [1] * len(weights):
        exact = [total * w / sum(weights) for w in weights]
        assert all(abs(s - e) <= 1.0 for s, e in zip(shares, exact))


def test_proportional_impossible_is_empty():
    assert proportional(3, [1, 1], [2, 2]) == []
    assert proportional(1, [1, 1], [1, 1]) == []


def brute(total, rates):
    best, arg = float("inf"), None
    ranges = [range(1, total // r.micro_batch_size + 1) for r in rates]
    for ms in itertools.product(*ranges):
        if sum(m * r.micro_batch_size for m, r in zip(ms, rates)) != total:
            continue
        t = max(r.time(m) for m, r in zip(ms, rates))
        if t < best:
            best, arg = t, ms
    return best, arg


@pytest.mark.parametrize("seed", range(12))
def test_allocate_is_the_exact_minimax(seed):
    rnd = random.Random(seed)
    P = rnd.choice([2, 3])
    total = rnd.choice([8, 12, 16, 24])
    rates = []
    for _ in range(P):
        p = rnd.randint(1, 4)
        rates.append(PipelineRate(rnd.choice([1, 2, 4]), [rnd.uniform(0.5, 3.0) for _ in range(p)],
                                  [rnd.uniform(0.0, 1.0) for _ in range(p)], rnd.uniform(0, 0.2), max_m=total,
                                  slot_s=rnd.choice([0.0, rnd.uniform(0.0, 1.0)])))  # brute uses time(): the one formula
    expected, _ = brute(total, rates)
    got = allocate(total, rates)
    if expected == float("inf"):
        assert got is None
        return
    assert got is not None
    assert sum(m * r.micro_batch_size for m, r in zip(got, rates)) == total
    assert max(r.time(m) for m, r in zip(got, rates)) == pytest.approx(expected, rel=1e-12)


def test_allocate_gives_the_faster_pipeline_more():
    slow = PipelineRate(2, [3.0, 3.0], [0.1, 0.1], 0.0, max_m=64)
    fast = PipelineRate(2, [1.0, 1.0], [0.1, 0.1], 0.0, max_m=64)
    ms = allocate(64, [slow, fast])
    assert ms[1] > 2 * ms[0]
    assert 2 * sum(ms) == 64
