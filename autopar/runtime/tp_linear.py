"""Column- and row-parallel styles for every linear layer a TP plan names: ``nn.Linear``, and transformers'
``Conv1D`` (GPT-2's projections), a linear layer that stores its weight transposed, ``(in, out)``.

torch's ``ColwiseParallel`` / ``RowwiseParallel`` shard an ``nn.Linear``'s ``(out, in)`` weight; a Conv1D's
output features are its weight's columns, so column-parallel shards its weight on dim 1 (and its bias with the
outputs), row-parallel on dim 0 (the bias stays whole, added once after the partial sums are reduced). Its own
forward (``addmm(bias, x, weight)``) then runs on the DTensors exactly as ``F.linear`` does for the ``nn.Linear``:
the same placements in, the same out. Checkpoints keep the tensors as the module stores them.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.placement_types import Placement

from autopar.models.hf_fused import is_conv1d


def _shard_params(placements: dict[str, Placement]):
    """A ``distribute_module`` partition function placing each named parameter of the module as given."""
    def partition(_name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for pname, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(pname, nn.Parameter(distribute_tensor(p, mesh, [placements[pname]]),
                                                          requires_grad=p.requires_grad))
    return partition


class Colwise(ColwiseParallel):
    """``ColwiseParallel``, and for a Conv1D its weight's columns (and its bias) sharded."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not is_conv1d(module):
            return super()._apply(module, device_mesh)
        return distribute_module(module, device_mesh, _shard_params({"weight": Shard(1), "bias": Shard(0)}),
                                 partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                                 partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class Rowwise(RowwiseParallel):
    """``RowwiseParallel``, and for a Conv1D its weight's rows sharded (its bias whole)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not is_conv1d(module):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts = (Shard(-1),)
        return distribute_module(module, device_mesh, _shard_params({"weight": Shard(0), "bias": Replicate()}),
                                 partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                                 partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))
