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
    raise AutoparError("model", f"{type(model).__name__} has no layer units the runtime understands",
                       "give an nn.Sequential or a model with embed, layers (nn.ModuleList) and head children")


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
