"""Deterministic weights: every rank builds exactly the units it holds, equal to the single-device model.

Two ways to get equal weights everywhere:

* a model built with real weights (same seed on every rank, e.g. ``torch.manual_seed(0); GPT(cfg)``)
  is used as it is: each rank keeps its units' tensors and drops the rest;
* a model built on the meta device is materialised unit by unit: ``init_unit`` seeds the RNG from
  (seed, unit name) alone and calls ``reset_parameters()`` of every module that owns parameters, in
  module order. The result depends on nothing but the seed and the unit, so a rank materialising
  only ``layers.3`` gets the same tensors as ``init_weights(model, seed)`` on one CPU process.
  Initialisation runs on the CPU generator and is then moved, so it does not depend on the device.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.units import units


def unit_seed(seed: int, unit_name: str) -> int:
    """The RNG seed of one unit: a function of (seed, unit name) only."""
    return zlib.crc32(f"{seed}/{unit_name}".encode())


def is_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in list(module.parameters()) + list(module.buffers()))


@torch.no_grad()
def init_unit(unit: nn.Module, unit_name: str, seed: int) -> None:
    """Initialise ``unit`` in place from (seed, unit name): ``reset_parameters()`` of each module owning tensors."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(unit_seed(seed, unit_name))
        for fqn, m in unit.named_modules():
            owns = list(m.parameters(recurse=False)) or list(m.buffers(recurse=False))
            if not owns:
                continue
            reset = getattr(m, "reset_parameters", None)
            if reset is None:
                raise AutoparError("model", f"module {unit_name}.{fqn or '<unit>'} ({type(m).__name__}) owns "
                                   "tensors but has no reset_parameters(), so it cannot be built from the meta "
                                   "device", "add reset_parameters() or build the model on the CPU")
            reset()


def materialize_unit(unit: nn.Module, unit_name: str, seed: int, device: torch.device) -> nn.Module:
    """Give a meta-device unit real, deterministic weights on ``device`` (real units are just moved)."""
    if is_meta(unit):
        unit.to_empty(device="cpu")
        init_unit(unit, unit_name, seed)
    return unit.to(device)


def init_weights(model: nn.Module, seed: int = 0) -> nn.Module:
    """Materialise (if on meta) and initialise every unit of ``model`` on the CPU exactly as ``wrap`` does.

    The single-device reference for a meta-built model: ``init_weights(Model(cfg), seed)`` equals
    what ``wrap(meta_model, plan, seed=seed)`` places on the ranks.
    """
    for name, unit in units(model):
        if is_meta(unit):
            unit.to_empty(device="cpu")
        init_unit(unit, name, seed)
    return model
