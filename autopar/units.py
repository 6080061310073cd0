"""The unit contract shared by the planner's tracer, the runtime and the models they run.

A *unit* is what a plan places: for models with ``embed`` / ``layers`` / ``head`` children the units
are ``embed``, ``layers.0`` ... ``layers.N-1``, ``head``; for an ``nn.Sequential`` they are its
children by name, nested Sequentials expanded (``0.0``, ``0.1``, ``1``). Units run one after the
other, each taking the previous unit's output. ``discover`` is the one expansion rule, shared by the
planner's tracer (which also expands ``ModuleList`` / ``ModuleDict`` inside any module, since it
only measures) and ``units`` (what the runtime can run), so a searched plan names units wrap accepts.
``unit_tp_info`` is what the runtime and the tracer ask of a unit: its TP table (or None: tp = 1
only), the numbers a TP degree must divide, and the submodules selective checkpointing recomputes.
``AttentionCore`` marks the part selective checkpointing recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from autopar.errors import AutoparError


class AttentionCore(nn.Module):
    """Causal scaled-dot-product attention over ``[B, heads, S, head_dim]`` tensors; no parameters.

    A module of its own so selective activation checkpointing can recompute exactly this part.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def has_unit_layout(model: nn.Module) -> bool:
    """True for models with ``embed``, ``layers`` (an ``nn.ModuleList``) and ``head`` children."""
    return (isinstance(getattr(model, "layers", None), nn.ModuleList) and hasattr(model, "embed")
            and hasattr(model, "head"))


CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def discover(model: nn.Module, containers: tuple[type, ...] = CONTAINERS, repeats: bool = True,
             ) -> list[tuple[str, nn.Module]]:
    """Candidate units of ``model`` in registration order, as (FQN, module): its children, those
    that are ``containers`` expanded recursively. ``repeats``: a module object registered at two
    positions is listed at both (else at its first only). A model without children: [("model", model)]."""
    def children(mod: nn.Module) -> list[tuple[str, nn.Module]]:
        if repeats:
            return [(n, c) for n, c in mod._modules.items() if c is not None]
        return list(mod.named_children())

    def expand(prefix: str, mod: nn.Module) -> list[tuple[str, nn.Module]]:
        if isinstance(mod, containers) or not prefix:
            return [u for n, c in children(mod) for u in expand(f"{prefix}.{n}" if prefix else n, c)]
        return [(prefix, mod)]

    return expand("", model) or [("model", model)]


def units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layer units of ``model`` in execution order, as (name, module).

    An ``nn.Sequential`` runs its children in order, so its units are ``discover``'s (nested
    Sequentials expanded); a module object at two positions is listed at both (it runs twice).
    """
    if isinstance(model, nn.Sequential):
        return discover(model, (nn.Sequential,))
    if has_unit_layout(model):
        return ([("embed", model.embed)] + [(f"layers.{i}", b) for i, b in enumerate(model.layers)]
                + [("head", model.head)])
    return chain_units(model)


_CHAIN_FIX = ("make forward() pass one tensor from unit to unit (x = unit(x) for each child, containers "
              "expanded) with no other operation in between, moving any other work into a child module, "
              "or give an nn.Sequential")


class _UnitTracer(torch.fx.Tracer):
    """torch.fx tracer that keeps the candidate units opaque (their own forwards are not traced)."""

    def __init__(self, leaves: set[int]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return id(m) in self.leaves or super().is_leaf_module(m, qualname)


def chain_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The units of any other module, in execution order, when its forward is a chain of them.

    The candidates are ``discover``'s (children, ``nn.Sequential`` / ``nn.ModuleList`` /
    ``nn.ModuleDict`` expanded: the names the search's tracer gives). ``torch.fx`` traces the
    model's own ``forward`` with the candidates kept opaque, and the graph must be exactly
    ``input -> unit -> unit -> ... -> output``: each candidate called once, on the previous unit's
    output alone. Loops over a ``ModuleList`` unroll into such a chain. Anything else (an operation
    between units, a second input, a unit called twice or never, the model's own parameters,
    control flow that depends on the data) is refused in one line naming it, since running the units
    one after another would then not compute the model's forward. A model without children is one
    unit, ``model``.
    """
    cls = type(model).__name__
    candidates = discover(model, repeats=False)
    if candidates == [("model", model)]:
        return candidates
    own = [n for n, t in list(model._parameters.items()) + list(model._buffers.items()) if t is not None]
    if own:
        raise AutoparError("model", f"{cls} holds tensor {own[0]!r} itself, outside every unit", _CHAIN_FIX)
    by_name = dict(candidates)
    try:
        graph = _UnitTracer({id(m) for _, m in candidates}).trace(model)
    except Exception as e:  # noqa: BLE001  (any tracing failure becomes the one-line refusal)
        first = (str(e).splitlines() or [""])[0][:160]
        raise AutoparError("model", f"{cls}.forward cannot be followed as a chain of units by torch.fx "
                           f"({type(e).__name__}: {first})", _CHAIN_FIX) from None
    order: list[tuple[str, nn.Module]] = []
    value = None
    for node in graph.nodes:
        after = f"after unit {order[-1][0]}" if order else "before the first unit"
        if node.op == "placeholder":
            if value is not None:
                raise AutoparError("model", f"{cls}.forward takes a second input {node.name!r}", _CHAIN_FIX)
            value = node
        elif node.op == "call_module" and node.target in by_name:
            if any(n == node.target for n, _ in order):
                raise AutoparError("model", f"{cls}.forward calls unit {node.target} twice", _CHAIN_FIX)
            if node.args != (value,) or node.kwargs:
                raise AutoparError("model", f"{cls}.forward gives unit {node.target} other arguments than the "
                                   "previous unit's output alone", _CHAIN_FIX)
            order.append((node.target, by_name[node.target]))
            value = node
        elif node.op == "output":
            if node.args != (value,):
                raise AutoparError("model", f"{cls}.forward returns something other than its last unit's "
                                   "output", _CHAIN_FIX)
        else:
            what = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", node.op)
            raise AutoparError("model", f"{cls}.forward runs {node.op} {what!r} {after}, outside every unit",
                               _CHAIN_FIX)
    unused = [n for n, _ in candidates if n not in {u for u, _ in order}]
    if unused:
        raise AutoparError("model", f"{cls}.forward never calls unit {unused[0]} (its parameters would not "
                           "train)", "remove it from the model, or call it in forward()")
    return order


def unit_kind(name: str) -> str:
    """``embed``, ``block`` or ``head`` for a unit of an embed/layers/head model."""
    if name in ("embed", "head"):
        return name
    return "block"


@dataclass(frozen=True)
class UnitTPInfo:
    plan: dict[str, str] | None  # submodule FQN -> style name; None: the unit runs with tp = 1 only
    divisors: tuple[int, ...]  # a TP degree must divide each of these
    selective: tuple[str, ...]  # FQNs (inside the unit) of attention cores: what selective ckpt recomputes


def selective_targets(unit: nn.Module) -> tuple[str, ...]:
    """FQNs of the attention cores inside ``unit`` (empty when it has none)."""
    return tuple(name for name, m in unit.named_modules() if isinstance(m, AttentionCore))


def unit_tp_info(model: nn.Module, unit_name: str, unit: nn.Module) -> UnitTPInfo:
    """TP plan, TP divisors and selective-checkpoint targets of one unit of ``model``.

    A model with embed / layers / head children states its TP tables itself: ``tp_plans`` (unit kind
    -> {submodule FQN: style name}), ``tp_divisors`` (unit kind -> numbers a TP degree must divide)
    and optionally ``selective_ckpt`` (unit kind -> FQNs to recompute). Anything else runs with tp 1.
    """
    if has_unit_layout(model) and hasattr(model, "tp_plans"):
        kind = unit_kind(unit_name)
        plan = model.tp_plans.get(kind)
        selective = getattr(model, "selective_ckpt", {}).get(kind, ())
        return UnitTPInfo(plan, tuple(model.tp_divisors.get(kind, ())) if plan else (),
                          tuple(selective) or selective_targets(unit))
    return UnitTPInfo(None, (), selective_targets(unit))
