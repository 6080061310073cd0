"""Reference models: shapes, units, causality, TP tables that name real submodules, deterministic init."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.models import (
    GPT,
    GPT_TP_PLAN,
    LLAMA_TP_PLAN,
    TP_PLANS,
    GPTConfig,
    Llama,
    LlamaConfig,
)
from autopar.runtime.materialize import init_weights, materialize_unit
from autopar.units import unit_kind, unit_tp_info, units

CONFIGS = {
    "gpt": lambda: GPT(GPTConfig(vocab_size=50, seq_len=12, dim=24, n_layers=3, n_heads=6, ffn_hidden=40)),
    "llama": lambda: Llama(LlamaConfig(vocab_size=50, seq_len=12, dim=24, n_layers=3, n_heads=6, n_kv_heads=2,
                                       ffn_hidden=40)),
}


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_forward_shape_and_units(family):
    model = CONFIGS[family]()
    tokens = torch.randint(0, 50, (2, 12))
    assert model(tokens).shape == (2, 12, 50)
    assert [n for n, _ in units(model)] == ["embed", "layers.0", "layers.1", "layers.2", "head"]
    x = tokens
    for _, u in units(model):  # running the units one after another is the model
        x = u(x)
    torch.testing.assert_close(x, model(tokens))


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_attention_is_causal(family):
    model = CONFIGS[family]()
    a = torch.randint(0, 50, (1, 12))
    b = a.clone()
    b[0, 8:] = (b[0, 8:] + 1) % 50
    torch.testing.assert_close(model(a)[:, :8], model(b)[:, :8])
    assert not torch.allclose(model(a)[:, 8:], model(b)[:, 8:])


@pytest.mark.parametrize("family,table", [("gpt", GPT_TP_PLAN), ("llama", LLAMA_TP_PLAN)])
def test_tp_tables_name_real_submodules(family, table):
    model = CONFIGS[family]()
    for name, unit in units(model):
        info = unit_tp_info(model, name, unit)
        assert info.plan is table[unit_kind(name)]
        for fqn in info.plan:
            unit.get_submodule(fqn)  # raises if the table names a module that does not exist
    assert set(TP_PLANS) == {f"{family}.{k}" for family in ("gpt", "llama") for k in ("embed", "block", "head")}


def test_tp_divisors_and_selective_targets():
    model = CONFIGS["llama"]()
    assert unit_tp_info(model, "layers.0", model.layers[0]).divisors == (6, 2, 40)
    assert unit_tp_info(model, "embed", model.embed).divisors == (50,)
    assert unit_tp_info(model, "layers.1", model.layers[1]).selective == ("attn.core",)
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    info = unit_tp_info(seq, "0", seq[0])
    assert info.plan is None and info.divisors == () and info.selective == ()
    assert [n for n, _ in units(seq)] == ["0", "1"]


def test_units_of_other_structures():
    """A module without children is one unit; one whose forward is not a chain of units is refused."""
    lin = nn.Linear(2, 2)
    assert units(lin) == [("model", lin)]

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)

        def forward(self, x):
            return self.a(self.a(x))

    with pytest.raises(AutoparError, match="calls unit a twice"):
        units(Twice())


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_init_is_per_unit_and_deterministic(family):
    """A unit materialised alone from the meta device equals the same unit of a whole init_weights model."""
    full = init_weights(CONFIGS[family](), seed=7)
    again = init_weights(CONFIGS[family](), seed=7)
    other = init_weights(CONFIGS[family](), seed=8)
    with torch.device("meta"):
        meta = CONFIGS[family]()
    unit = materialize_unit(meta.layers[1], "layers.1", seed=7, device=torch.device("cpu"))
    ref = dict(full.layers[1].named_parameters())
    for k, v in unit.named_parameters():
        torch.testing.assert_close(v, ref[k], atol=0, rtol=0)
    for (k, a), (_, b), (_, c) in zip(full.named_parameters(), again.named_parameters(), other.named_parameters()):
        assert torch.equal(a, b), k
        if "norm" not in k and "ln" not in k:
            assert not torch.equal(a, c), k


def test_init_refuses_modules_without_reset_parameters():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2))

    with pytest.raises(AutoparError, match="reset_parameters"):
        init_weights(nn.Sequential(Odd()))
