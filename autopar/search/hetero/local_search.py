"""Local search over shapes with the cost model as the judge.

Moves, cheapest and most often useful first:
  * the moves below applied to every pipeline at once, when the pipelines are alike;
  * move a stage to another place in its pipeline, nearest places first (stage order: memory, links);
  * merge two adjacent stages of one node / split a stage into two halves on its node
    (the number of stages, hence the bubble against memory);
  * split a pipeline in two (every stage halved) / merge two pipelines (the number of pipelines);
  * move a stage to another pipeline, or swap two stages between pipelines (devices or nodes
    between pipelines, hence the pipelines' balance).
First improvement is taken; the search stops at a local optimum or at the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from autopar.cluster.cluster import Cluster
from autopar.search.hetero.graph_partition import Devices, Shape, canonical, order_stages, pieces
from autopar.search.hetero.realise import Candidate, Realiser

MAX_SHIFT = 2  # a stage moves at most this many places per move (longer moves chain through shorter ones)


def _replace(shape: Shape, j: int, pipe: tuple[Devices, ...] | None) -> Shape:
    out = list(shape)
    if pipe is None:
        out.pop(j)
    else:
        out[j] = pipe
    return tuple(out)


def _pipeline_moves(pipe: tuple[Devices, ...], cluster: Cluster, max_stages: int
                    ) -> Iterator[tuple[Devices, ...]]:
    """One pipeline one move away: a stage moved (nearest places first), two merged, one halved."""
    for dist in range(1, min(len(pipe), MAX_SHIFT + 1)):
        for i in range(len(pipe)):
            for t in (i - dist, i + dist):
                if 0 <= t < len(pipe):
                    new = list(pipe)
                    new.insert(t, new.pop(i))
                    yield tuple(new)
    for i in range(len(pipe) - 1):
        a, b = pipe[i], pipe[i + 1]
        if len(pieces(cluster, a + b)) == 1:
            yield pipe[:i] + (tuple(sorted(a + b)),) + pipe[i + 2:]
    if len(pipe) < max_stages:
        for i, st in enumerate(pipe):
            if len(st) % 2 == 0 and len(pieces(cluster, st)) == 1:
                h = len(st) // 2
                yield pipe[:i] + (st[:h], st[h:]) + pipe[i + 1:]


def neighbours(shape: Shape, cluster: Cluster, max_stages: int) -> Iterator[Shape]:
    """Every shape one move away from ``shape`` (may repeat; the caller memoises).

    When all pipelines have as many stages, the same move applied to every pipeline comes first:
    it keeps equal pipelines equal (and their gradient sync between matching stages).
    """
    P = len(shape)
    if P > 1 and len({len(p) for p in shape}) == 1:
        for moved in zip(*(_pipeline_moves(p, cluster, max_stages) for p in shape)):
            if len({len(p) for p in moved}) == 1:
                yield tuple(moved)
    for j, pipe in enumerate(shape):
        for new in _pipeline_moves(pipe, cluster, max_stages):
            yield _replace(shape, j, new)
    for j, pipe in enumerate(shape):  # split a pipeline in two: each stage's devices halved
        if all(len(st) % 2 == 0 and len(pieces(cluster, st)) == 1 for st in pipe):
            first = tuple(st[:len(st) // 2] for st in pipe)
            second = tuple(st[len(st) // 2:] for st in pipe)
            yield _replace(shape, j, first) + (second,)
    if P < 2:
        return
    for a in range(P):  # merge two pipelines
        for b in range(a + 1, P):
            if len(shape[a]) + len(shape[b]) <= max_stages:
                merged = order_stages(cluster, list(shape[a]) + list(shape[b]))
                yield _replace(_replace(shape, a, merged), b, None)
    for a in range(P):  # move one stage to another pipeline
        if len(shape[a]) < 2:
            continue
        for i, st in enumerate(shape[a]):
            for b in range(P):
                if b == a or len(shape[b]) >= max_stages:
                    continue
                src = shape[a][:i] + shape[a][i + 1:]
                dst = order_stages(cluster, list(shape[b]) + [st])
                yield _replace(_replace(shape, a, src), b, dst)
    for a in range(P):  # swap two stages of different GPU types or sizes between pipelines
        for b in range(a + 1, P):
            for i, sa in enumerate(shape[a]):
                for k, sb in enumerate(shape[b]):
                    if cluster.gpu_of(sa[0]) == cluster.gpu_of(sb[0]) and len(sa) == len(sb):
                        continue
                    pa, pb = list(shape[a]), list(shape[b])
                    pa[i], pb[k] = sb, sa
                    yield _replace(_replace(shape, a, tuple(pa)), b, tuple(pb))


def improve(realise: Realiser, start: Candidate, cluster: Cluster, max_stages: int, deadline: float | None,
            max_rounds: int = 200) -> tuple[Candidate, bool]:
    """Hill-climb from ``start``; returns the best candidate and whether the deadline cut it short."""
    best = start
    for _ in range(max_rounds):
        moved = False
        for nb in neighbours(best.shape, cluster, max_stages):
            if deadline is not None and time.perf_counter() > deadline:
                return best, True
            if canonical(nb) == best.shape:
                continue
            c = realise(nb)
            if c is not None and c.time < best.time * (1 - 1e-9):
                best = c
                moved = True
                break
        if not moved:
            break
    return best, False
