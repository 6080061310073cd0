"""Deterministic weights: every rank builds exactly the units it holds, equal to the single-device model.

Two ways to get equal weights everywhere:

* a model built with real weights (same seed on every rank, e.g. ``torch.manual_seed(0); GPT(cfg)``)
  is used as it is: each rank keeps its units' tensors and drops the rest;
* a model built on the meta device (``with torch.device("meta"): model = Model(cfg)``, or a
  transformers ``AutoModelForCausalLM.from_config(cfg)`` built there) is materialised unit by unit:
  ``init_unit`` seeds the CPU RNG from (seed, unit name) alone (``unit_seed``) and initialises the
  unit's modules with the *init function*:

  - ``init_fn(module)`` when the caller gives one (``wrap(..., init_fn=...)``), on every module,
    children before parents (as HF's ``post_init`` applies ``_init_weights``);
  - else, for a transformers model (raw or through ``from_transformers``), the model's own
    ``_init_weights(module)`` (what HF's ``post_init`` applies: its ``initializer_range`` normals,
    ones for norms, the rotary tables);
  - else each module's ``reset_parameters()`` (torch's own layers, autopar.models), for the modules
    owning tensors, in module order.

  The result depends on nothing but the seed, the unit's name and the init function, so a rank
  materialising only ``layers.3`` gets the same tensors as ``init_weights(model, seed)`` (the
  single-device reference, ``autopar.init_reference``) on one CPU process. It is not the tensors a
  plain ``torch.manual_seed(seed); Model(cfg)`` draws: those depend on every earlier module's draws,
  which a rank holding one unit cannot replay without building the whole model.

  Every floating tensor is filled with NaN before the init function runs and checked after it: a
  parameter or buffer the init function leaves unset is refused in one line naming it, never left
  as uninitialised memory.

Memory: ``wrap`` materialises one unit at a time on the CPU, then applies TP / FSDP to it, which keeps
only this rank's shard; units of other stages are never materialised. The peak is this rank's shards
plus one whole unit (``tests/runtime/test_meta_init.py`` measures it). Initialisation runs on the CPU
generator and is then moved, so it does not depend on the device.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.units import units

InitFn = Callable[[nn.Module], None]


def unit_seed(seed: int, unit_name: str) -> int:
    """The RNG seed of one unit: a function of (seed, unit name) only."""
    return zlib.crc32(f"{seed}/{unit_name}".encode())


def is_meta(module: nn.Module) -> bool:
    """True when any parameter or buffer of ``module`` lives on the meta device."""
    return any(t.is_meta for t in list(module.parameters()) + list(module.buffers()))


def model_init_fn(model: nn.Module) -> InitFn | None:
    """The init function a model brings: its ``init_module(module)`` method when it has one (the
    ``from_transformers`` view has the HF model's), a transformers model's ``_init_weights``; None
    for anything else (then ``reset_parameters()`` of each module)."""
    own = getattr(model, "init_module", None)  # autopar.models.hf.HFCausalLM: the HF model's _init_weights
    if callable(own):
        return own
    if type(model).__module__.startswith("transformers.") and callable(getattr(model, "_init_weights", None)):
        return model._init_weights
    return None


def _owned(m: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False))
            if t is not None]


@torch.no_grad()
def init_unit(unit: nn.Module, unit_name: str, seed: int, init_fn: InitFn | None = None) -> None:
    """Initialise ``unit`` in place from (seed, unit name): ``init_fn(module)`` on every module of the
    unit, children before their parent (the order of HF's ``post_init``, so a parent's init, e.g.
    T5's attention scaling, overrides its children's generic one), or, without ``init_fn``,
    ``reset_parameters()`` of each module owning tensors, in module order.

    Raises AutoparError naming the first tensor left unset (or the module lacking
    ``reset_parameters``): one line, the fix included.
    """
    if init_fn is not None:
        _init_modules(_post_order("", unit), unit_name, seed, init_fn)
    else:
        _init_modules([(fqn, m) for fqn, m in unit.named_modules() if _owned(m)], unit_name, seed, None)


def _post_order(prefix: str, module: nn.Module) -> list[tuple[str, nn.Module]]:
    out = [u for n, c in module.named_children() for u in _post_order(f"{prefix}.{n}" if prefix else n, c)]
    return out + [(prefix, module)]


def _init_modules(modules: list[tuple[str, nn.Module]], unit_name: str, seed: int, init_fn: InitFn | None) -> None:
    how = "init_fn" if init_fn is not None else "reset_parameters()"
    owners = [(fqn, m) for fqn, m in modules if _owned(m)]
    for _fqn, m in owners:
        for _, t in _owned(m):
            t.fill_(float("nan") if t.is_floating_point() or t.is_complex() else 0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(unit_seed(seed, unit_name))
        for fqn, m in modules:
            if init_fn is not None:
                init_fn(m)
                continue
            reset = getattr(m, "reset_parameters", None)
            if reset is None:
                raise AutoparError("model", f"module {unit_name}{'.' + fqn if fqn else ''} ({type(m).__name__}) owns "
                                   "tensors but has no reset_parameters(), so it cannot be built from the meta "
                                   "device", "add reset_parameters(), pass wrap(..., init_fn=...), or build the "
                                   "model on the CPU")
            reset()
    for fqn, m in owners:
        for name, t in _owned(m):
            if (t.is_floating_point() or t.is_complex()) and torch.isnan(t).any():
                where = f"{unit_name}.{fqn + '.' if fqn else ''}{name}"
                raise AutoparError("model", f"{where} ({type(m).__name__}) is not set by {how} when the model is "
                                   "built from the meta device", "initialise it there (or in reset_parameters()), "
                                   "or build the model on the CPU")


def materialize_unit(unit: nn.Module, unit_name: str, seed: int, device: torch.device,
                     init_fn: InitFn | None = None) -> nn.Module:
    """Give a meta-device unit real, deterministic weights on ``device`` (real units are just moved)."""
    if is_meta(unit):
        unit.to_empty(device="cpu")
        init_unit(unit, unit_name, seed, init_fn)
    return unit.to(device)


def _slots(unit: nn.Module) -> list[tuple[nn.Module, str, str, int]]:
    """(module, "_parameters" or "_buffers", attribute, id of the tensor) of every tensor slot of ``unit``."""
    return [(m, kind, attr, id(t)) for m in unit.modules() for kind in ("_parameters", "_buffers")
            for attr, t in getattr(m, kind).items() if t is not None]


def init_weights(model: nn.Module, seed: int = 0, init_fn: InitFn | None = None) -> nn.Module:
    """Materialise (if on meta) and initialise every unit of ``model`` on the CPU exactly as ``wrap`` does.

    The single-device reference for a meta-built model: ``init_weights(Model(cfg), seed)`` equals
    what ``wrap(meta_model, plan, seed=seed)`` places on the ranks, for every plan. ``init_fn``: as
    ``wrap``'s (default: the model's own, ``model_init_fn``). A transformers model is initialised
    through its units view (``from_transformers``), in place. A tensor several units share (tied
    embeddings, a module used twice) keeps the value the first unit that runs with it gives it, and
    stays one tensor (each later unit still draws its own init, so the units' seeds stay
    independent of the ties). Returns ``model``.
    """
    from autopar.models.hf import units_view

    view = units_view(model)
    init_fn = init_fn or model_init_fn(view)
    named = units(view)
    slots = [_slots(unit) for _, unit in named]  # taken before to_empty replaces the tensors
    first: dict[int, tuple[nn.Module, str, str]] = {}
    values: dict[int, torch.Tensor] = {}
    for (name, unit), unit_slots in zip(named, slots):
        if is_meta(unit) or any(key in first for *_, key in unit_slots):
            unit.to_empty(device="cpu")  # a module shared with an earlier unit is re-made, then restored below
        init_unit(unit, name, seed, init_fn)
        with torch.no_grad():
            for m, kind, attr, key in unit_slots:
                if key not in first:
                    first[key] = (m, kind, attr)
                    values[key] = getattr(m, kind)[attr].detach().clone()
                else:  # tied to an earlier unit: that unit's value, and one tensor again
                    fm, fkind, fattr = first[key]
                    tensor = getattr(fm, fkind)[fattr]
                    tensor.copy_(values[key])
                    getattr(m, kind)[attr] = tensor
    for fqn, m in model.named_modules():  # outside the units (a raw HF model's own rotary table)
        if any(t.is_meta for _, t in _owned(m)):
            m.to_empty(device="cpu", recurse=False)
            with torch.no_grad():
                _init_modules([("", m)], fqn, seed, init_fn)
    return model


def tied_values(sources: list[tuple[int, str, nn.Module, int]], seed: int, init_fn: InitFn | None,
                ) -> list[tuple[int, torch.Tensor]]:
    """For a unit holding copies of tied tensors: (its parameter index, the value the tensor's first
    unit gives it), each first unit materialised on the CPU from a meta copy and dropped (one unit's
    memory at a time). ``sources``: (parameter index, first unit's name, a meta copy of it, index there)."""
    out = []
    for index, name, meta_unit, first_index in sources:
        tmp = copy.deepcopy(meta_unit)
        tmp.to_empty(device="cpu")
        init_unit(tmp, name, seed, init_fn)
        out.append((index, list(tmp.parameters())[first_index].detach().clone()))
        del tmp
    return out
