"""Pieces shared by the reference models: the attention core, unit listing and unit kinds.

A *unit* is what a plan places: for models with ``embed`` / ``layers`` / ``head`` children the units
are ``embed``, ``layers.0`` ... ``layers.N-1``, ``head``; for an ``nn.Sequential`` they are its
children by name. Units run one after the other, each taking the previous unit's output.
"""

from __future__ import annotations

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


def units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layer units of ``model`` in execution order, as (name, module)."""
    if isinstance(model, nn.Sequential):
        return list(model.named_children())
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
