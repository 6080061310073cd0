"""search(): the front door, and the only place that picks a planner.

A homogeneous cluster (one GPU type, uniform network) goes to ``search_homogeneous`` (homogeneous.py),
any other to ``search_heterogeneous`` (hetero/driver.py). Both take the same arguments and return a
``SearchResult`` (result.py) with ``planner`` saying which ran; neither calls back into this module.
"""

from __future__ import annotations

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from autopar.modelspec.spec import ModelSpec
from autopar.search.context_parallel import search_over_cp
from autopar.search.hetero.driver import search_heterogeneous
from autopar.search.homogeneous import search_homogeneous
from autopar.search.options import SearchOptions
from autopar.search.result import SearchResult

MAX_GLOBAL_BATCH = 10**9  # samples; its divisors are the micro-batch counts tried


def search(model: ModelSpec, cluster: Cluster, global_batch_size: int, opts: SearchOptions | None = None,
           with_baselines: bool = True) -> SearchResult:
    """The fastest plan under the cost model that fits, with its estimate and the baselines.

    ``result.estimate.step_time_s`` is the figure the chosen planner optimised. Raises AutoparError
    (one line, naming the closest setting) when the batch size is not a positive integer or nothing fits.
    """
    opts = opts or SearchOptions()
    if not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise AutoparError("global_batch_size", f"must be a positive integer, got {global_batch_size!r}",
                           "pass --global-batch-size N with N >= 1")
    if global_batch_size > MAX_GLOBAL_BATCH:
        raise AutoparError("global_batch_size", f"too large: {global_batch_size} (at most {MAX_GLOBAL_BATCH})",
                           "give the batch in samples (sequences), e.g. --global-batch-size 2048")
    if not cluster.is_homogeneous:
        return search_heterogeneous(model, cluster, global_batch_size, opts, with_baselines)
    # one homogeneous search per context-parallel degree (only cp 1 below 16384 tokens)
    return search_over_cp(search_homogeneous, model, cluster, global_batch_size, opts, with_baselines)
