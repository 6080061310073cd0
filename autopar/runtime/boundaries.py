"""What crosses between ranks must be one tensor of micro-batch rows: checked on every rank before it could hang.

A unit's output travels to another rank when the next unit is on the next pipeline stage or runs
with another layout (TP degree, devices) inside the stage. That exchange moves one tensor whose
first dimension is the micro-batch's rows. A unit returning a tuple, a dict or a tensor without the
batch dimension first would crash the sending rank and leave its peers waiting in their receives.

``BoundaryCheck`` runs the whole unit chain once per input shape on the meta device (structure-only
copies of the units taken before wrap shards them: no memory, no compute, no communication) and
raises the same AutoparError on every rank, before the schedule starts, naming the unit, what it
returned and the fix. A model whose forward cannot run on the meta device is not checked.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

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
    return f"a {type(x).__name__}"


class BoundaryCheck:
    """Call with a step's inputs on every rank: raises if a crossing unit output is not a row tensor."""

    def __init__(self, named: list[tuple[str, nn.Module]], plan: Plan) -> None:
        self.crossing = crossing_units(plan)
        self.rows = plan.pipelines[0].micro_batch_size
        self.checked: set = set()
        try:
            self.units = [(n, _meta_copy(m)) for n, m in named] if self.crossing else []
        except Exception:  # noqa: BLE001  (a module that cannot be deep-copied: leave the model unchecked)
            self.crossing, self.units = {}, []

    def __call__(self, inputs: torch.Tensor) -> None:
        key = (tuple(inputs.shape[1:]), inputs.dtype)
        if not self.crossing or key in self.checked:
            return
        self.checked.add(key)
        x = torch.empty((self.rows, *inputs.shape[1:]), dtype=inputs.dtype, device="meta")
        if not x.is_floating_point():
            x = x.zero_()
        problem = None
        try:
            for name, unit in self.units[:-1]:
                x = unit(x)
                if name in self.crossing and (not isinstance(x, torch.Tensor) or x.dim() == 0
                                              or x.shape[0] != self.rows):
                    problem = (name, self.crossing[name], _describe(x))
                    break
        except Exception:  # noqa: BLE001  (a forward the meta device cannot run: leave it unchecked)
            return
        if problem is not None:
            name, nxt, what = problem
            raise AutoparError("model", f"unit {name} returns {what} for a micro-batch of {self.rows} rows, but its "
                               f"output goes to {nxt} on other ranks (pipeline stage or layout change), which "
                               "takes one tensor with the micro-batch rows first",
                               f"return one such tensor from {name}, or keep {name} and {nxt} in one stage with "
                               "the same tp")
