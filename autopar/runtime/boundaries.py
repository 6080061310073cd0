"""What crosses between ranks: tensors of micro-batch rows, checked on every rank before anything could hang.

A unit's output travels to another rank when the next unit is on the next pipeline stage or runs
with another layout (TP degree, devices) inside the stage. That exchange moves one tensor whose
first dimension is the micro-batch's rows. A tuple or dict of such tensors (one floating dtype) is
packed into one ``[rows, sum of the leaves' sizes]`` tensor after the unit and unpacked before the
next (differentiable: gradients flow back through the same split), so the exchange is unchanged.
Anything else (an integer or None leaf, mixed dtypes, a tensor without the rows first) would crash
the sending rank and leave its peers waiting in their receives.

``BoundaryCheck`` runs the whole unit chain once per input shape on the meta device (structure-only
copies of the units taken before wrap shards them: no memory, no compute, no communication), records
how each crossing output packs, and raises the same AutoparError on every rank, before the schedule
starts, for an output it cannot carry, naming the unit, what it returned and the fix. A model whose
forward cannot run on the meta device is not checked (nor packed).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from autopar.errors import AutoparError
from autopar.plan.schema import Plan


def _meta_copy(unit: nn.Module) -> nn.Module:
    """The unit's structure with meta tensors in place of its parameters and buffers."""
    memo: dict = {}
    for t in list(unit.parameters()) + list(unit.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(unit, memo)


def crossing_units(plan: Plan) -> dict[str, str]:
    """Unit -> the next unit, for every unit whose output leaves its ranks in some pipeline."""
    out = {}
    for pipe in plan.pipelines:
        chain = [(st.devices, ly) for st in pipe.stages for ly in st.layers]
        for (devs, ly), (next_devs, nxt) in zip(chain, chain[1:]):
            if devs != next_devs or ly.strategy.tp != nxt.strategy.tp:
                out[ly.name] = nxt.name
    return out


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    leaves = tree_flatten(x)[0]
    kinds = sorted({str(t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__ for t in leaves})
    return f"a {type(x).__name__} of {', '.join(kinds)}"


@dataclass(frozen=True)
class Packing:
    """How a tuple / dict output of one unit travels as one tensor: its structure and leaf shapes."""

    spec: TreeSpec
    trailing: tuple[tuple[int, ...], ...]  # each leaf's shape after the rows

    def pack(self, out) -> torch.Tensor:
        leaves, spec = tree_flatten(out)
        if spec != self.spec:  # the structure changed since the check: refuse rather than mis-split
            raise AutoparError("model", f"a unit returned {spec} after returning {self.spec} for the same input "
                               "shape", "return the same structure for every micro-batch")
        rows = leaves[0].shape[0]
        return torch.cat([t.reshape(rows, -1) for t in leaves], dim=1)

    def unpack(self, x: torch.Tensor):
        rows = x.shape[0]
        parts = torch.split(x, [math.prod(t) for t in self.trailing], dim=1)
        return tree_unflatten([p.reshape(rows, *t) for p, t in zip(parts, self.trailing)], self.spec)


def _packing(x, rows: int) -> Packing | None | str:
    """None: one row tensor (sent as it is); a Packing for a tree of row tensors; else the reason."""
    if isinstance(x, torch.Tensor):
        return None if x.dim() >= 1 and x.shape[0] == rows else "bad"
    leaves, spec = tree_flatten(x)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if (not leaves or len(tensors) < len(leaves) or len({t.dtype for t in tensors}) > 1
            or not tensors[0].is_floating_point() or any(t.dim() == 0 or t.shape[0] != rows for t in tensors)):
        return "bad"
    return Packing(spec, tuple(tuple(t.shape[1:]) for t in tensors))


class BoundaryCheck:
    """Call with a step's inputs on every rank: records how crossing outputs pack, raises if one cannot."""

    def __init__(self, named: list[tuple[str, nn.Module]], plan: Plan) -> None:
        self.crossing = crossing_units(plan)
        self.before = {nxt: name for name, nxt in self.crossing.items()}
        self.rows = plan.pipelines[0].micro_batch_size
        self.checked: dict[tuple, dict[str, Packing]] = {}  # input shape -> how its crossing outputs pack
        self.packing: dict[str, Packing] = {}  # for this step's input shape
        try:
            self.units = [(n, _meta_copy(m)) for n, m in named] if self.crossing else []
        except Exception:  # noqa: BLE001  (a module that cannot be deep-copied: leave the model unchecked)
            self.crossing, self.units = {}, []

    def pack(self, name: str, out):
        """Unit ``name``'s output as it crosses: one tensor (packed if it is a tuple / dict)."""
        packing = self.packing.get(name)
        return out if packing is None else packing.pack(out)

    def unpack(self, name: str, x):
        """The input of unit ``name`` as its predecessor returned it (unpacked if it was packed)."""
        packing = self.packing.get(self.before.get(name, ""))
        return x if packing is None else packing.unpack(x)

    def __call__(self, inputs: torch.Tensor) -> None:
        key = (tuple(inputs.shape[1:]), inputs.dtype)
        if not self.crossing:
            return
        if key in self.checked:  # leaf shapes may depend on the input's (a sequence length): this step's
            self.packing = self.checked[key]
            return
        self.packing = self.checked[key] = {}
        x = torch.empty((self.rows, *inputs.shape[1:]), dtype=inputs.dtype, device="meta")
        if not x.is_floating_point():
            x = x.zero_()
        problem, packing = None, {}
        try:
            for name, unit in self.units[:-1]:
                x = unit(x)
                if name in self.crossing:
                    how = _packing(x, self.rows)
                    if how == "bad":
                        problem = (name, self.crossing[name], _describe(x))
                        break
                    if how is not None:
                        packing[name] = how
        except Exception:  # noqa: BLE001  (a forward the meta device cannot run: leave it unchecked)
            return
        if problem is not None:
            del self.checked[key]  # refused again if the caller goes on with this shape
            name, nxt, what = problem
            raise AutoparError("model", f"unit {name} returns {what} for a micro-batch of {self.rows} rows, but its "
                               f"output goes to {nxt} on other ranks (pipeline stage or layout change), which "
                               "takes tensors of one floating dtype (or one tensor) with the micro-batch rows first",
                               f"return such tensors from {name} (a tuple or dict of them is fine), or keep {name} "
                               f"and {nxt} in one stage with the same tp")
        self.packing.update(packing)
