"""Activation checkpointing of a unit: none, selective (the attention core only) or full (the whole unit).

Non-reentrant ``torch.utils.checkpoint`` only: the reentrant variant silently drops gradients of
parameters it cannot see (checked on torch 2.13, CPU). The checkpoint goes around the module's
``forward``, inside the hooks TP and FSDP install on ``__call__`` (torchtitan's order: checkpoint,
then shard), so a recomputation re-runs the unit's math, not its parameter all-gathers.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.utils.checkpoint import checkpoint

from autopar.errors import AutoparError


def _checkpointed(fn: Callable) -> Callable:
    def run(*args, **kwargs):
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)

    return run


def apply_checkpointing(unit: nn.Module, mode: str, selective_targets: tuple[str, ...]) -> None:
    """Recompute activations of ``unit`` in backward as ``mode`` says (in place).

    ``selective`` checkpoints the submodules named in ``selective_targets`` (attention cores); a unit
    without any keeps all activations, matching the cost model where its attention-core FLOPs are 0.
    """
    if mode == "none":
        return
    if mode == "full":
        unit.forward = _checkpointed(unit.forward)
        return
    if mode == "selective":
        for fqn in selective_targets:
            core = unit.get_submodule(fqn)
            core.forward = _checkpointed(core.forward)
        return
    raise AutoparError("ckpt", f"unknown mode {mode!r}", "use none, selective or full")
