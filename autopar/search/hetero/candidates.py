"""Per-layer strategy candidates of a stage kind, scored once per micro-batch size.

``layer_costs`` depends on the number of micro-batches m only through ``cost = fwd + bwd + step / m``
(the same expression it evaluates), so the strategies of a (stage kind, micro-batch size) are scored
once and re-priced for every m the search tries. Pruning is the homogeneous search's rule set:
the structural rules of ``enumerate_strategies`` and dominance inside a (tp, sp) layout (slower and
at least as large in model states and activations), applied in one vectorised pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from autopar.estimate import LayerCosts, StageContext, layer_costs, layout_switch_time, transient_bound
from autopar.modelspec.spec import LayerSpec
from autopar.plan.schema import Strategy
from autopar.search.rules import Rule
from autopar.search.space import LayerCandidates, enumerate_strategies, tp_degrees

_EPS = 1e-12  # as space.prune_dominated: float noise never makes one strategy dominate another


@dataclass
class ScoredLayer:
    strategies: list[Strategy]
    costs: LayerCosts  # computed with some m; ``cost`` is re-priced per m
    layouts: np.ndarray
    transient: float  # transient_bound over the strategies: independent of m


@dataclass
class KindBatch:
    """A stage kind at one micro-batch size: scored strategies per signature and layout switch costs."""

    ctx: StageContext
    layers: dict[int, ScoredLayer]
    switch: dict[int, np.ndarray]


def score_kind(sig_layer: dict[int, LayerSpec], ctx: StageContext, pruned: Counter,
               max_tp: int | None = None) -> KindBatch:
    """Every structurally legal strategy of every layer signature, scored in ``ctx``, TP up to ``max_tp``."""
    tps = tp_degrees(ctx, pruned, max_tp)
    layouts: dict[tuple[int, bool], int] = {}
    layers = {}
    for s, ly in sig_layer.items():
        strategies = enumerate_strategies(ly, ctx, tps, pruned)
        if strategies:
            costs = layer_costs(ly, strategies, ctx)
        else:
            costs = LayerCosts(*(np.zeros(0) for _ in range(6)))
        lay = np.array([layouts.setdefault((st.tp, st.sp), len(layouts)) for st in strategies], dtype=int)
        layers[s] = ScoredLayer(strategies, costs, lay, transient_bound(ly, ctx, strategies))
    order = sorted(layouts, key=layouts.get)
    switch = {s: np.array([[layout_switch_time(ly.boundary_bytes, a, b, ctx) for b in order] for a in order],
                          dtype=float).reshape(len(order), len(order)) for s, ly in sig_layer.items()}
    return KindBatch(ctx, layers, switch)


def candidates_at(kb: KindBatch, m: int, prune: bool, pruned: Counter) -> dict[int, LayerCandidates]:
    """The candidates of every signature with costs for ``m`` micro-batches, dominated ones dropped."""
    out = {}
    for s, sl in kb.layers.items():
        c = sl.costs
        cost = c.fwd + c.bwd + c.step / m
        keep = np.arange(len(cost))
        if prune and len(cost) > 1:
            keep = _undominated(cost, c.mem_states, c.mem_act, sl.layouts)
            pruned[Rule.DOMINATED] += len(cost) - len(keep)
        costs = LayerCosts(c.fwd[keep], c.bwd[keep], c.step[keep], cost[keep], c.mem_states[keep], c.mem_act[keep])
        out[s] = LayerCandidates([sl.strategies[i] for i in keep], costs, sl.layouts[keep], sl.transient)
    return out


def _undominated(cost: np.ndarray, ms: np.ndarray, ma: np.ndarray, layout: np.ndarray) -> np.ndarray:
    """Indices not dominated inside their layout (ties: the first stays), as space.prune_dominated."""
    n = len(cost)
    le = np.ones((n, n), dtype=bool)
    strict = np.zeros((n, n), dtype=bool)
    for v in (cost, ms, ma):
        le &= v[:, None] <= v[None, :] * (1 + _EPS)
        strict |= v[:, None] < v[None, :] * (1 - _EPS)
    idx = np.arange(n)
    dom = le & (strict | (idx[:, None] < idx[None, :])) & (layout[:, None] == layout[None, :])
    np.fill_diagonal(dom, False)
    return np.flatnonzero(~dom.any(axis=0))
