"""Plans to draw: small and fast to search (one homogeneous 2-stage pipeline with checkpointing, one
heterogeneous plan of two pipelines), each with its model, cost parameters and estimate."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib
import pytest

from autopar.cluster import load_cluster
from autopar.estimate import PlanEstimate, estimate_plan
from autopar.modelspec.load import load_model
from autopar.modelspec.spec import ModelSpec
from autopar.plan import save_plan
from autopar.plan.schema import Plan
from autopar.search import SearchOptions, search
from cost_models import CostParams

matplotlib.use("Agg")


@dataclass
class Drawn:
    plan: Plan
    model: ModelSpec
    params: CostParams
    est: PlanEstimate
    path: str


def _searched(tmp_path_factory, name: str, cluster: str, opts: SearchOptions) -> Drawn:
    model = load_model("gpt3-1.3b", 512)
    res = search(model, load_cluster(cluster), 16, opts, with_baselines=False)
    path = tmp_path_factory.mktemp("show") / f"{name}.yaml"
    save_plan(res.plan, path)
    return Drawn(res.plan, model, opts.params, estimate_plan(res.plan, model, opts.params), str(path))


@pytest.fixture(scope="session")
def homogeneous(tmp_path_factory) -> Drawn:
    """2 stages of 4 A100s, a memory budget tight enough that some layers recompute."""
    return _searched(tmp_path_factory, "homogeneous", "2x4xA100-80G",
                     SearchOptions(pp_degrees=[2], memory_budget_gib=4.3))


@pytest.fixture(scope="session")
def heterogeneous(tmp_path_factory) -> Drawn:
    return _searched(tmp_path_factory, "heterogeneous", "4x3090+4xA100-80G", SearchOptions())


@pytest.fixture(scope="session", params=["homogeneous", "heterogeneous"])
def drawn(request) -> Drawn:
    return request.getfixturevalue(request.param)
