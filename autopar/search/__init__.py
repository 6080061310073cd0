"""Plan search: strategy space and pruning, per-layer DP, pipeline partition, baselines."""

from autopar.search.options import SearchOptions
from autopar.search.result import SearchResult
from autopar.search.run import search

__all__ = ["SearchOptions", "SearchResult", "search"]
