"""Mixture-of-experts units of a traced module: which submodules are routed experts, and the FLOPs the
meta trace cannot count for them.

An experts container is a module with an integer ``num_experts`` whose own parameters are all packed
per expert (weights >= 3-D, per-expert biases 2-D, first dimension ``num_experts``: HF Mixtral / Qwen-MoE /
gpt-oss ``*Experts`` of transformers 5), or an ``nn.ModuleList`` of ``num_experts`` expert MLPs under a module stating
``num_experts`` (the older per-expert layout). ``top_k`` is the first integer ``top_k`` (or
``num_experts_per_tok``) of a module of the same unit (the router or the sparse block).

Routing is data dependent, so on the meta device torch counts no FLOPs for the experts' grouped
matmuls (``grouped_mm`` has no meta FLOP formula) and whatever it counts for a per-expert loop follows
meaningless meta routing. Dropless top-k routing runs every token through exactly ``top_k`` experts, so
the experts' forward FLOPs per sample are ``2 x top_k x (one expert's parameters) x seq_len``; the
trace replaces what the counter saw inside the experts (``ExpertFlops``) by that.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from autopar.modelspec.spec import MoESpec

SWIGLU_MATRICES = 3  # gate, up, down: one expert's parameters are 3 x hidden x width
SWIGLU_SAVED = 4


def _experts_of(mod: nn.Module) -> list[tuple[nn.Module, int]]:
    """(experts container, expert count) found in ``mod``'s tree."""
    out = []
    for m in mod.modules():
        e = getattr(m, "num_experts", None)
        if not isinstance(e, int) or e < 1:
            continue
        own = list(m.parameters(recurse=False))  # packed weights, and their per-expert biases (gpt-oss)
        if any(p.dim() >= 3 for p in own) and all(p.dim() >= 2 and p.shape[0] == e for p in own):
            out.append((m, e))
            continue
        for child in m.children():
            if isinstance(child, nn.ModuleList) and len(child) == e:
                out.append((child, e))
    return out


def _top_k(mod: nn.Module) -> int | None:
    for m in mod.modules():
        for attr in ("top_k", "num_experts_per_tok"):
            k = getattr(m, attr, None)
            if isinstance(k, int) and k >= 1:
                return k
    return None


class ExpertFlops:
    """Forward hooks on every experts container of ``module`` recording the FLOPs ``counter`` saw inside."""

    def __init__(self, module: nn.Module, counter: FlopCounterMode) -> None:
        self.counter = counter
        self.containers = {id(m) for m, _ in _experts_of(module)}
        self.seen: dict[int, float] = {}
        self._start: dict[int, float] = {}
        self.handles = []
        for m in module.modules():
            if id(m) in self.containers:
                self.handles.append(m.register_forward_pre_hook(self._pre))
                self.handles.append(m.register_forward_hook(self._post))

    def _pre(self, mod, args) -> None:
        self._start[id(mod)] = float(self.counter.get_total_flops())

    def _post(self, mod, args, out) -> None:
        self.seen[id(mod)] = self.seen.get(id(mod), 0.0) + float(self.counter.get_total_flops()) - self._start[id(mod)]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def counted(self, unit: nn.Module) -> float:
        """Forward FLOPs the counter attributed to ``unit``'s experts containers (all samples)."""
        return sum(self.seen.get(id(m), 0.0) for m, _ in _experts_of(unit))


def unit_moe(unit: nn.Module, seq: int, boundary_bytes: float, dtype_bytes: int) -> MoESpec | None:
    """The ``MoESpec`` of one traced unit (None: no experts, or no ``top_k`` found). ``boundary_bytes``:
    the unit's output per sample (seq x hidden x dtype for a block), which is what each of a token's
    ``top_k`` copies carries to its expert."""
    found = _experts_of(unit)
    k = _top_k(unit)
    if not found or k is None:
        return None
    num = found[0][1]
    params = sum(p.numel() for m, _ in found for p in m.parameters())
    base = MoESpec(num_experts=num, top_k=min(k, num), expert_params=params)
    per_expert = base.params_per_expert
    hidden = boundary_bytes / (seq * dtype_bytes) if seq and dtype_bytes else 0.0
    width = per_expert / (SWIGLU_MATRICES * hidden) if hidden else 0.0
    return replace(base, expert_flops=2.0 * base.top_k * per_expert * seq, dispatch_bytes=float(base.top_k * boundary_bytes),
                   expert_act_bytes=float(base.top_k * (boundary_bytes + SWIGLU_SAVED * seq * width * dtype_bytes)))
