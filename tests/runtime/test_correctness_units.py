"""The search's tracer and wrap discover the same units: a plan searched (library call) for a nested
``nn.Sequential`` names units ``0.0``, ``0.1``, ... that wrap accepts, and training under it equals
single-process training."""

from __future__ import annotations

import pytest
from torch import nn

from tests.runtime.cases import float_data, mse
from tests.runtime.reference import assert_matches_reference

pytestmark = pytest.mark.dist


def nested() -> nn.Module:
    shared = nn.Linear(16, 16)
    return nn.Sequential(nn.Sequential(nn.Linear(6, 16), nn.Tanh()),
                         nn.Sequential(shared, nn.GELU(), nn.Sequential(nn.Linear(16, 16), nn.Tanh())),
                         shared, nn.Linear(16, 3))


NAMES = ["0.0", "0.1", "1.0", "1.1", "1.2.0", "1.2.1", "2", "3"]


@pytest.mark.parametrize("nproc", [2, 4])
def test_a_searched_plan_for_a_nested_sequential_wraps_and_trains_exactly(nproc):
    from autopar.cluster.parse import load_cluster
    from autopar.modelspec.trace import spec_from_module
    from autopar.search import SearchOptions, search
    from autopar.units import units

    x, y = float_data()
    spec = spec_from_module(nested(), x[:1], name="nested")
    assert [ly.name for ly in spec.layers] == NAMES == [n for n, _ in units(nested())]
    res = search(spec, load_cluster(f"{nproc}xcpu"), 8, SearchOptions(), with_baselines=False)
    assert [ly.name for p in res.plan.pipelines[:1] for st in p.stages for ly in st.layers] == NAMES
    assert_matches_reference(nested, res.plan, x, y, loss_fn=mse)
