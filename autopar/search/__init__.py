"""Plan search: strategy space and pruning, per-layer DP, pipeline partition, baselines."""

from autopar.search.options import SearchOptions
from autopar.search.run import SearchResult, search

__all__ = ["SearchOptions", "SearchResult", "search"]
