"""A custom model that is not an nn.Sequential (an encoder, a ``ModuleList`` of blocks looped over in
forward, a head) is searched and wrapped under the same units and trains exactly like one process;
a forward that does something between units is refused in one line naming it, on every rank."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.units import units
from tests.runtime.cases import float_data, mse, same
from tests.runtime.reference import assert_matches_reference, wrap_outcomes

pytestmark = pytest.mark.dist


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x)))


class Net(nn.Module):
    """Registered head first: units run in forward's order, not registration order."""

    def __init__(self, dim: int = 12, depth: int = 3) -> None:
        super().__init__()
        self.head = nn.Linear(dim, 3)
        self.encoder = nn.Sequential(nn.Linear(6, dim), nn.GELU())
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.encoder(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


NAMES = ["encoder.0", "encoder.1", "blocks.0", "blocks.1", "blocks.2", "head"]


@pytest.mark.parametrize("nproc", [2, 4])
def test_a_searched_plan_for_a_custom_model_wraps_and_trains_exactly(nproc):
    from autopar.cluster.parse import load_cluster
    from autopar.modelspec.trace import spec_from_module
    from autopar.search import SearchOptions, search

    x, y = float_data()
    spec = spec_from_module(Net(), x[:1], name="net")
    assert [ly.name for ly in spec.layers] == NAMES == [n for n, _ in units(Net())]
    res = search(spec, load_cluster(f"{nproc}xcpu"), 8, SearchOptions(), with_baselines=False)
    assert_matches_reference(Net, res.plan, x, y, loss_fn=mse)


@pytest.mark.parametrize("plan", [
    [(4, 2, [([0], same(NAMES[:3])), ([1], same(NAMES[3:], zero=0))])],
    [(2, 4, [([0, 1], same(NAMES[:4], zero=3)), ([2, 3], same(NAMES[4:], zero=1, ckpt="full"))])],
], ids=["pp2", "dp2-pp2-zero3"])
def test_custom_model_pipelines(plan):
    x, y = float_data()
    assert_matches_reference(Net, make_plan(plan), x, y, loss_fn=mse)


class Glue(Net):
    def forward(self, x):
        x = self.encoder(x) * 2
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Masked(Net):
    def forward(self, x):
        x = self.encoder(x)
        for block in self.blocks:
            x = block(x) if x.sum() > 0 else x
        return self.head(x)


class Skips(Net):
    def forward(self, x):
        x = self.encoder(x)
        for block in self.blocks[:2]:
            x = block(x)
        return self.head(x)


class OwnParameter(Net):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(12))


class TwoInputs(Net):
    def forward(self, x, mask):
        x = self.encoder(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


_FIX = "; make forward() pass one tensor from unit to unit"


@pytest.mark.parametrize("model,problem", [
    (Glue, "model: Glue.forward runs call_function 'mul' after unit encoder.1, outside every unit"),
    (Masked, "model: Masked.forward cannot be followed as a chain of units by torch.fx (TraceError: symbolically "
             "traced variables cannot be used as inputs to control flow)"),
    (Skips, "model: Skips.forward never calls unit blocks.2 (its parameters would not train); remove it"),
    (OwnParameter, "model: OwnParameter holds tensor 'scale' itself, outside every unit"),
    (TwoInputs, "model: TwoInputs.forward takes a second input 'mask'"),
], ids=["op-between-units", "data-dependent-flow", "unused-child", "own-parameter", "two-inputs"])
def test_what_discovery_cannot_follow_is_named(model, problem):
    with pytest.raises(AutoparError) as err:
        units(model())
    assert str(err.value).startswith(problem)
    assert "\n" not in str(err.value)
    if "never calls" not in problem:
        assert _FIX in str(err.value)


def test_a_model_wrap_cannot_follow_is_refused_on_every_rank():
    out = wrap_outcomes(Glue, make_plan([(4, 2, [([0], same(NAMES[:3])), ([1], same(NAMES[3:]))])]))
    assert out[0] == out[1] and out[0].startswith("model: Glue.forward runs call_function 'mul' after unit encoder.1")
