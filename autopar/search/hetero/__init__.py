"""Heterogeneous planner: asymmetric pipelines by hierarchical graph partitioning, exact layer splits
per pipeline, batch shares by speed, and local search judged by the cost model."""

from autopar.search.hetero.driver import plan_search, search_heterogeneous

__all__ = ["plan_search", "search_heterogeneous"]
