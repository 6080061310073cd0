"""CostCache: memoised per-layer costs and cross-pipeline sync times, owned by whoever runs many estimates.

A search or a set of baselines scores the same layers on equal stages over and over; it creates one
``CostCache`` and passes it to every ``estimate_plan`` (and ``stage_cost``) it runs, and the memo
lives as long as that caller keeps it. ``estimate_plan`` without one makes a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from autopar.cluster.cluster import Cluster
from autopar.estimate.context import StageContext
from autopar.modelspec.spec import LayerSpec
from autopar.plan.schema import Strategy
from cost_models.layer import LayerCost, one_layer_cost

MAX_LAYER_ENTRIES = 200_000  # bound on memory for very long-running callers: start over past it
MAX_OTHER_ENTRIES = 100_000


class CostCache:
    """Memo of ``one_layer_cost`` by (layer without its name, strategy, stage shape) and of sync times.

    Keys hold ``id(cluster)``; every entry also holds the cluster itself, so no key can outlive its
    cluster and be matched by another one that reuses its id.
    """

    def __init__(self) -> None:
        self._layers: dict[tuple, tuple[LayerCost, Cluster]] = {}
        self._nameless: dict[int, tuple[LayerSpec, LayerSpec]] = {}
        self._syncs: dict[tuple, tuple[float, Cluster]] = {}

    def _nameless_layer(self, ly: LayerSpec) -> LayerSpec:
        """The layer without its name (repeated blocks share entries); memoised per object."""
        hit = self._nameless.get(id(ly))
        if hit is None or hit[0] is not ly:
            if len(self._nameless) > MAX_OTHER_ENTRIES:
                self._nameless.clear()
            hit = (ly, replace(ly, name=""))
            self._nameless[id(ly)] = hit
        return hit[1]

    def layer_cost(self, ly: LayerSpec, s: Strategy, ctx: StageContext) -> LayerCost:
        """``one_layer_cost(ly, s, ctx)``, memoised."""
        shape = ctx.tie_key if ly.tied_params or ly.shared_params else ctx.shape_key  # a tie: where its copy is
        key = (self._nameless_layer(ly), s, shape)
        hit = self._layers.get(key)
        if hit is None:
            if len(self._layers) > MAX_LAYER_ENTRIES:
                self._layers.clear()
            hit = (one_layer_cost(ly, s, ctx), ctx.cluster)
            self._layers[key] = hit
        return hit[0]

    def sync_time(self, cluster: Cluster, key: tuple, compute: Callable[[], float]) -> float:
        """``compute()`` memoised under (``cluster``, ``key``)."""
        full = (id(cluster), key)
        hit = self._syncs.get(full)
        if hit is None or hit[1] is not cluster:
            if len(self._syncs) > MAX_OTHER_ENTRIES:
                self._syncs.clear()
            hit = (compute(), cluster)
            self._syncs[full] = hit
        return hit[0]
