"""Per-layer dynamic programming inside a stage: a Pareto frontier of (memory, time) per layout.

For a run of layers, every assignment of strategies gives a stage time (sum of per-layer costs plus
the cost of re-laying out activations where adjacent layers change (tp, sp)) and a memory need (sum
of per-layer bytes). Keeping, for each layout of the last layer, only the points no other point
beats in both memory and time is exact: any optimal completion of a dropped point is matched by the
point that dominated it. No memory discretisation, so nothing is lost to rounding.

Transformer blocks repeat, so ranges are keyed by their sequence of layer *signatures* in a trie:
every range "embed + 7 blocks", wherever it starts, is computed once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.search.space import LayerCandidates

MAX_POINTS_PER_LAYOUT = 4096  # frontiers beyond this are thinned (never reached on real models)


@dataclass
class Frontier:
    mem: np.ndarray
    time: np.ndarray
    layout: np.ndarray
    parent_point: np.ndarray  # index into the parent node's frontier (-1 at the first layer)
    strategy: np.ndarray  # index into the layer's LayerCandidates
    parent: int  # parent node id (-1: root)
    sig: int
    step: np.ndarray  # the points' summed step tails (``LayerCosts.step``), carried for the pipeline formula


class RangeTrie:
    """Frontiers for every run of layer signatures, for one stage context and in-flight count."""

    def __init__(self, candidates: dict[int, LayerCandidates], switch: dict[int, np.ndarray], inflight: int,
                 mem_cap: float):
        self.candidates = candidates
        self.switch = switch  # sig of the previous layer -> [prev layout, new layout] seconds
        self.inflight = inflight
        self.mem_cap = mem_cap
        self.nodes: list[Frontier] = []
        self.children: dict[tuple[int, int], int] = {}
        self._mem = {sig: c.costs.mem(inflight) for sig, c in candidates.items()}
        self.points_examined = 0

    def child(self, parent: int, sig: int) -> int:
        key = (parent, sig)
        node = self.children.get(key)
        if node is None:
            node = self._extend(parent, sig)
            self.children[key] = node
        return node

    def _extend(self, parent: int, sig: int) -> int:
        cand = self.candidates[sig]
        c, m, lay = cand.costs.cost, self._mem[sig], cand.layouts
        if parent < 0:
            new_m, new_t, new_s = m.copy(), c.copy(), cand.costs.step.copy()
            new_l, pp, st = lay.copy(), np.full(len(c), -1), np.arange(len(c))
            self.points_examined += len(new_t)
            ok = new_m <= self.mem_cap
            new_m, new_t, new_l, pp, st, new_s = new_m[ok], new_t[ok], new_l[ok], pp[ok], st[ok], new_s[ok]
            keep = pareto_by_group(new_l, new_m, new_t)
        else:
            pf = self.nodes[parent]
            sw = self.switch[pf.sig][pf.layout][:, lay]  # P x S
            T = pf.time[:, None] + (c[None, :] + sw)
            M = pf.mem[:, None] + m[None, :]
            self.points_examined += T.size
            flat = product_frontier(T, M, pf.layout, lay, self.mem_cap)
            pp, st = np.divmod(flat, len(c))
            new_s = pf.step[pp] + cand.costs.step[st]
            self.nodes.append(Frontier(M.ravel()[flat], T.ravel()[flat], lay[st], pp, st, parent, sig, new_s))
            return len(self.nodes) - 1
        self.nodes.append(Frontier(new_m[keep], new_t[keep], new_l[keep], pp[keep], st[keep], parent, sig,
                                   new_s[keep]))
        return len(self.nodes) - 1

    def best(self, node: int, mem_limit: float) -> tuple[float, int]:
        """(least time, point index) among points needing at most ``mem_limit`` bytes; (inf, -1) if none."""
        f = self.nodes[node]
        ok = np.flatnonzero(f.mem <= mem_limit)
        if len(ok) == 0:
            return float("inf"), -1
        i = ok[np.argmin(f.time[ok])]
        return float(f.time[i]), int(i)

    def step(self, node: int, point: int) -> float:
        """The summed step tail of the assignment ending at ``point`` (0 for no point)."""
        return float(self.nodes[node].step[point]) if point >= 0 else 0.0

    def trace(self, node: int, point: int) -> list[int]:
        """Strategy indices (into each layer's candidates) of the assignment ending at ``point``."""
        out = []
        while node >= 0:
            f = self.nodes[node]
            out.append(int(f.strategy[point]))
            point = int(f.parent_point[point])
            node = f.parent
        return out[::-1]


def pareto_by_group(group: np.ndarray, mem: np.ndarray, time: np.ndarray, span: float | None = None) -> np.ndarray:
    """Indices of points not dominated (in mem and time) by another point of the same group.

    Ties keep the first point. Result is sorted by (group, mem). One vectorised pass: after sorting
    by (group, mem, time), a point survives when it is faster than every earlier point of its group;
    shifting each group's times below the previous group's makes one running minimum reset at
    group boundaries. ``span``: the shift's unit, ``max(time) - min(time) + 1`` of these points by
    default (``product_frontier`` passes the figure of the whole set it filtered).
    """
    n = len(mem)
    if n == 0:
        return np.zeros(0, dtype=int)
    order = np.lexsort((time, mem, group))
    g, t = group[order], time[order]
    if span is None:
        span = float(t.max() - t.min()) + 1.0
    shifted = t - g * (2.0 * span)
    prev_min = np.minimum.accumulate(np.r_[np.inf, shifted[:-1]])
    new_group = np.r_[True, g[1:] != g[:-1]]
    keep = new_group | (shifted < prev_min)
    # The shift can round; decide survivors inside a group on the unshifted times.
    idx = np.flatnonzero(keep)
    if len(idx) > 1:
        tk = t[idx]
        same = g[idx][1:] == g[idx][:-1]
        ok = np.ones(len(idx), dtype=bool)
        ok[1:] = ~same | (tk[1:] < tk[:-1])
        keep[:] = False
        keep[idx[ok]] = True
    out = order[keep]
    if len(out) > MAX_POINTS_PER_LAYOUT * 8:
        out = _thin(out, group, mem)
    return out


def product_frontier(T: np.ndarray, M: np.ndarray, row_layout: np.ndarray, col_layout: np.ndarray,
                     mem_cap: float) -> np.ndarray:
    """The frontier of the points (i, j) of ``T``, ``M`` (P x S: time and memory of parent point i extended by
    strategy j) within ``mem_cap``, grouped by ``col_layout[j]``: flat indices i * S + j, exactly
    ``pareto_by_group`` of those points in flat order (the same points in the same order), sorting fewer.

    Per layout, a staircase of the points of parents already in that layout (no switch) drops every
    point it dominates (``_dominated``), then a staircase of what is left drops more. A dropped point
    has a point of its group before it in ``pareto_by_group``'s order (group, mem, time, index) with a
    time no larger, so it is never kept and no later point's running minimum moves: the survivors'
    frontier, computed with the whole set's shift (``span``), is the whole set's, ties and rounding
    included. Points are visited column by column: along a strategy, memory rises with the parent
    within each parent layout, which keeps the binary searches local.
    """
    P, S = T.shape
    ok = M <= mem_cap
    if not ok.any():
        return np.zeros(0, dtype=int)
    tv = T[ok]
    span = float(tv.max() - tv.min()) + 1.0
    survivors = []
    for lv in np.unique(col_layout):
        cols = np.flatnonzero(col_layout == lv)
        qm, qt = M[:, cols].T.ravel(), T[:, cols].T.ravel()  # column by column
        live = ok[:, cols].T.ravel()
        ref = live & np.tile(row_layout == lv, len(cols))
        if ref.any():
            live &= ~_dominated(*_staircase(qm[ref], qt[ref]), qm, qt)
        left = np.flatnonzero(live)
        left = left[~_dominated(*_staircase(qm[left], qt[left]), qm[left], qt[left])]
        j, r = np.divmod(left, P)
        survivors.append(r * S + cols[j])
    idx = np.sort(np.concatenate(survivors))
    keep = pareto_by_group(col_layout[idx % S], M.ravel()[idx], T.ravel()[idx], span)
    return idx[keep]


def _staircase(mem: np.ndarray, time: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points of (``mem``, ``time``) with memory strictly rising and time strictly falling, such that the last
    one with memory <= x (or < x) is as fast as any point with memory <= x (< x)."""
    if len(mem) == 0:
        return mem, time
    o = np.argsort(mem)
    m, t = mem[o], time[o]
    first = t < np.minimum.accumulate(np.r_[np.inf, t[:-1]])  # faster than every point before it
    m, t = m[first], t[first]
    last = np.r_[m[1:] != m[:-1], True]  # of equal memory, the last (the fastest)
    return m[last], t[last]


def _dominated(Rm: np.ndarray, Rt: np.ndarray, qm: np.ndarray, qt: np.ndarray) -> np.ndarray:
    """Per query point: whether a staircase point has mem <= and time <, or mem < and time <=."""
    if len(Rm) == 0:
        return np.zeros(len(qm), dtype=bool)
    le = np.searchsorted(Rm, qm, side="right") - 1  # the fastest staircase point with mem <= the point's
    le0 = np.maximum(le, 0)
    lt = le - (Rm[le0] == qm)  # ... with mem < the point's
    return ((le >= 0) & (Rt[le0] < qt)) | ((lt >= 0) & (Rt[np.maximum(lt, 0)] <= qt))


def _thin(idx: np.ndarray, group: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """Keep at most MAX_POINTS_PER_LAYOUT evenly spread points per group (only for huge frontiers)."""
    parts = []
    for gv in np.unique(group[idx]):
        sel = idx[group[idx] == gv]
        if len(sel) > MAX_POINTS_PER_LAYOUT:
            sel = sel[np.unique(np.linspace(0, len(sel) - 1, MAX_POINTS_PER_LAYOUT).astype(int))]
        parts.append(sel)
    return np.concatenate(parts)
