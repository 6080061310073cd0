"""The random numbers a unit draws while it runs (dropout masks), as Megatron's RNG tracker arranges them.

What a rank draws inside a unit is a function of ``wrap``'s seed, the unit, the rank's replica and the model call and
the unit's call within it, never of the process's own RNG state (which every unit call puts back as it found it):

* A unit's stream is shared by its TP group. Without sequence parallelism the residual stream is replicated over
  TP, and a dropout mask drawn apart on each TP rank would make the replicas disagree, silently (the next
  row-parallel all-reduce sums parts computed from different activations). With sequence parallelism each rank
  of a unit that splits the sequence (a block, the head: ``tp_plans.splits_sequence``) holds its own tokens, so the
  stream takes the TP rank too; an embedding unit's output stays replicated, so its stream stays shared.
* From a column-parallel projection to the row-parallel one after it, each rank holds its own heads or FFN
  features: draws there (attention-probability dropout) come from a stream of the TP rank's own, seeded by one
  draw of the unit's stream (Megatron's model-parallel RNG), so the heads of different ranks get their own masks.
* Replicas (DP ranks, pipelines, CP ranks) draw apart: the seed takes the smallest rank of the TP group.
* The count is the model's call (``RNGClock``: which ``step`` call, and whether a step or a forward-only call) and
  the unit's calls within it, so training resumed from ``ParallelModel.load`` draws what it would have drawn.

Recomputation redraws the same masks: the hooks sit on ``__call__``, outside the checkpoint that wraps
``forward`` (autopar.runtime.checkpointing), so torch's checkpoint saves the unit's stream at its entry and
restores it to recompute, and the column-parallel stream is seeded from that stream alone.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from autopar.models.tp_plans import entries

_OPEN = ("colwise",)  # styles whose output is this rank's share of heads / features (autopar/models/tp_plans.py)
_CLOSE = ("rowwise",)  # styles whose input is that share


def _seed(*parts) -> int:
    """A 63-bit seed from ``parts`` (stable across processes and runs, unlike ``hash``)."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class _Streams:
    """Swap the CPU generator and the unit's accelerator generator in and out."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.accel = torch.get_device_module(device) if device.type not in ("cpu", "meta") else None

    def get(self) -> tuple:
        return torch.get_rng_state(), (self.accel.get_rng_state(self.device) if self.accel is not None else None)

    def set(self, state: tuple) -> None:
        torch.set_rng_state(state[0])
        if self.accel is not None:
            self.accel.set_rng_state(state[1], self.device)

    def seed(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)
        if self.accel is not None:
            self.accel.manual_seed(seed)


class RNGClock:
    """The model call units are in: ``ParallelModel`` sets ``tick`` to (its step count, the call's kind)."""

    tick: tuple = (0, "")


class UnitRNG:
    """The hooks of one unit on one rank (module docstring): ``install`` puts them on the unit and its TP plan's
    column- and row-parallel modules."""

    def __init__(self, name: str, seed: int, tp_group: tuple[int, ...], rank: int, own_tokens: bool,
                 device: torch.device, clock: RNGClock) -> None:
        self.name, self.seed, self.first, self.clock = name, seed, min(tp_group), clock
        self.tp_rank = tp_group.index(rank)
        self.own_tokens = own_tokens and len(tp_group) > 1  # the unit runs on this TP rank's share of the sequence
        self.streams, self.tick, self.calls = _Streams(device), None, 0
        self.outer = self.shared = None  # the process's state during a call; the unit stream's, in a TP window

    def install(self, unit: nn.Module, tp_table: dict[str, str] | None) -> None:
        """Hook ``unit``; ``tp_table``: its TP plan when it runs with tp > 1 and uncompiled (hooks inside a compiled
        forward would break its graph: there the TP ranks' heads share the unit's stream)."""
        unit.register_forward_pre_hook(self._enter)
        unit.register_forward_hook(self._leave, always_call=True)
        for fqn, style in entries(tp_table):
            if style in _OPEN:
                unit.get_submodule(fqn).register_forward_hook(self._open)
            elif style in _CLOSE:
                unit.get_submodule(fqn).register_forward_pre_hook(self._close)

    def _enter(self, _module, _args) -> None:
        self.outer, self.shared = self.streams.get(), None
        if self.tick != self.clock.tick:
            self.tick, self.calls = self.clock.tick, 0
        tp_part = self.tp_rank if self.own_tokens else "shared"
        self.streams.seed(_seed(self.seed, self.name, self.first, tp_part, *self.tick, self.calls))
        self.calls += 1

    def _leave(self, _module, _args, _output) -> None:
        if self.outer is not None:
            self.streams.set(self.outer)
        self.outer = self.shared = None

    def _open(self, _module, _args, _output) -> None:
        if self.shared is None:
            draw = int(torch.randint(0, 2**62, (1,)).item())  # from the unit's stream: the same in recomputation
            self.shared = self.streams.get()
            self.streams.seed(_seed(draw, self.tp_rank))

    def _close(self, _module, _args) -> None:
        if self.shared is not None:
            self.streams.set(self.shared)
            self.shared = None
