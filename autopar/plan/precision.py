"""A plan's training precision: the one place that turns (cluster, cost parameters, precision) into the
estimate's inputs, so the search, ``autopar estimate``, ``validate`` and the measured runs agree.

The precision rides on three inputs, each from the table ``cost_models.precision``: the cluster's GPUs
(``Cluster.at_precision``: the peak their GEMMs run at), the cost parameters (``with_precision``:
parameter, gradient-on-the-wire and model-state bytes; a plan stores them so, in ``search.cost_params``)
and the model spec (``activation_bytes``: ``ModelSpec.dtype_bytes``; the default keeps the model's own). A profile measures the runtime
in its own dtype, so a profiled search or estimate keeps the default precision and the profile's numbers.
"""

from __future__ import annotations

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from cost_models import CostParams
from cost_models.precision import DEFAULT, NAMES, PRECISIONS, with_precision


def check_precision(name: object, field: str = "precision") -> str:
    """``name`` when it is a precision of the table; else one-line AutoparError naming ``field``."""
    if name not in PRECISIONS:
        raise AutoparError(field, f"unknown precision {name!r}", f"use one of {', '.join(NAMES)}")
    return str(name)


def precision_params(name: str, params: CostParams | None = None) -> CostParams:
    """``params`` (default: CostParams()) with the byte counts of precision ``name``."""
    return with_precision(params if params is not None else CostParams(), PRECISIONS[check_precision(name)])


def activation_bytes(name: str) -> int | None:
    """The model spec's ``dtype_bytes`` at precision ``name`` (``load_model(..., dtype_bytes=...)``).

    The row's activation bytes, except for the default precision: None, the model's own (2 bytes for
    zoo models and HF configs, the parameters' dtype for a traced module), as every plan written
    before precisions existed was estimated, so that their figures stay what they were.
    """
    return None if check_precision(name) == DEFAULT else PRECISIONS[name].act_bytes


def at_precision(cluster: Cluster, params: CostParams, name: str, *, profiled: bool = False
                 ) -> tuple[Cluster, CostParams]:
    """(cluster, cost parameters) of a search or estimate at precision ``name``.

    ``profiled``: ``params`` and the cluster's figures are a profile's, measured in the runtime's own
    dtype; only the default precision goes with them (anything else: one-line AutoparError).
    """
    check_precision(name)
    if profiled:
        if name != DEFAULT:
            raise AutoparError("precision", f"{name} cannot be combined with a profile (a profile measures the "
                               "runtime in the model's own dtype)", "drop --precision or --profile")
        return cluster, params
    return cluster.at_precision(name), precision_params(name, params)
