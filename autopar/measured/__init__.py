"""Measured runs: public step-time measurements (format ``autopar-measured/1``) as what autopar estimates.

``load_runs(path)`` reads one file into a ``RunSet``: per case a ``ModelSpec``, a ``Cluster`` and a
``Plan`` with the measured step time, plus every case that cannot be estimated, named with its reason.
"""

from autopar.measured.load import load_runs
from autopar.measured.runs import Run, RunSet, Skip

__all__ = ["Run", "RunSet", "Skip", "load_runs"]
