"""Activation checkpointing of a unit: none, selective (the attention core only), full (the whole unit)
or op (torchtitan's op-level selective checkpointing of the whole unit: ``op_policy``).

Non-reentrant ``torch.utils.checkpoint`` only: the reentrant variant silently drops gradients of
parameters it cannot see (checked on torch 2.13, CPU). The checkpoint goes around the module's
``forward``, inside the hooks TP and FSDP install on ``__call__`` (torchtitan's order: checkpoint,
then shard), so a recomputation re-runs the unit's math, not its parameter all-gathers.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts, noop_context_fn

from autopar.errors import AutoparError
from autopar.runtime.op_policy import op_policy


def _op_contexts():
    return create_selective_checkpoint_contexts(op_policy())


def _checkpointed(fn: Callable, context_fn: Callable = noop_context_fn) -> Callable:
    # The default context_fn is left out rather than passed: torch.compile (wrap(compile=...)) traces
    # checkpoint only without an explicit no-op context_fn.
    extra = {} if context_fn is noop_context_fn else {"context_fn": context_fn}

    def run(*args, **kwargs):
        return checkpoint(fn, *args, use_reentrant=False, **extra, **kwargs)

    return run


def apply_checkpointing(unit: nn.Module, mode: str, selective_targets: tuple[str, ...]) -> None:
    """Recompute activations of ``unit`` in backward as ``mode`` says (in place).

    ``op`` checkpoints the whole unit under torchtitan's op-level policy (``op_policy``): matmul
    outputs but every second one and SDPA outputs are kept, the rest recomputed.
    ``selective`` checkpoints the submodules named in ``selective_targets`` (attention cores); a unit
    without any keeps all activations, matching the cost model where its attention-core FLOPs are 0.
    """
    if mode == "none":
        return
    if mode == "full":
        unit.forward = _checkpointed(unit.forward)
        return
    if mode == "op":
        unit.forward = _checkpointed(unit.forward, _op_contexts)
        return
    if mode == "selective":
        for fqn in selective_targets:
            core = unit.get_submodule(fqn)
            core.forward = _checkpointed(core.forward)
        return
    raise AutoparError("ckpt", f"unknown mode {mode!r}", "use none, selective, full or op")
