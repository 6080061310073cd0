"""Reference models in plain torch (GPT, Llama) and their tensor-parallel plans as data.

``unit_tp_info(model, unit)`` is what the runtime asks: the unit's TP table (or None: tp = 1 only),
the numbers a TP degree must divide, and the submodules selective checkpointing recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autopar.models.common import AttentionCore, has_unit_layout, unit_kind, units
from autopar.models.gpt import GPT, GPTConfig
from autopar.models.hf import from_transformers
from autopar.models.llama import Llama, LlamaConfig
from autopar.models.tp_plans import GPT_TP_DIVISORS, GPT_TP_PLAN, LLAMA_TP_DIVISORS, LLAMA_TP_PLAN, TP_PLANS

# model family -> (TP table per unit kind, config fields a TP degree must divide per unit kind)
FAMILIES: dict[str, tuple[dict, dict]] = {
    "gpt": (GPT_TP_PLAN, GPT_TP_DIVISORS),
    "llama": (LLAMA_TP_PLAN, LLAMA_TP_DIVISORS),
}


@dataclass(frozen=True)
class UnitTPInfo:
    plan: dict[str, str] | None  # submodule FQN -> style name; None: the unit runs with tp = 1 only
    divisors: tuple[int, ...]  # a TP degree must divide each of these
    selective: tuple[str, ...]  # FQNs (inside the unit) of attention cores: what selective ckpt recomputes


def selective_targets(unit: nn.Module) -> tuple[str, ...]:
    """FQNs of the attention cores inside ``unit`` (empty when it has none)."""
    return tuple(name for name, m in unit.named_modules() if isinstance(m, AttentionCore))


def unit_tp_info(model: nn.Module, unit_name: str, unit: nn.Module) -> UnitTPInfo:
    """TP plan, TP divisors and selective-checkpoint targets of one unit of ``model``."""
    family = getattr(model, "family", None)
    if has_unit_layout(model) and hasattr(model, "tp_plans"):  # e.g. autopar.models.hf: tables per instance
        kind = unit_kind(unit_name)
        plan = model.tp_plans.get(kind)
        selective = model.selective_ckpt.get(kind, ()) if hasattr(model, "selective_ckpt") else ()
        return UnitTPInfo(plan, tuple(model.tp_divisors.get(kind, ())) if plan else (),
                          selective or selective_targets(unit))
    if family in FAMILIES and has_unit_layout(model):
        tables, divisors = FAMILIES[family]
        kind = unit_kind(unit_name)
        cfg = model.config
        return UnitTPInfo(tables[kind], tuple(int(getattr(cfg, f)) for f in divisors[kind]),
                          selective_targets(unit))
    return UnitTPInfo(None, (), selective_targets(unit))


__all__ = ["FAMILIES", "GPT", "GPTConfig", "GPT_TP_PLAN", "LLAMA_TP_PLAN", "TP_PLANS", "AttentionCore", "Llama",
           "LlamaConfig", "UnitTPInfo", "from_transformers", "selective_targets", "unit_kind", "unit_tp_info", "units"]
