"""A checkpoint tensor of which this rank holds blocks that no DTensor placement describes.

A fused projection held as parts (autopar.models.hf_fused) is saved as one tensor: under TP a rank's share of it
is a block of each part (rows ``[offset_i + first, offset_i + first + n)`` of every part i; columns, for GPT-2's
transposed Conv1D), which a plain ``Shard`` cannot say (torch's strided placement says it, and its checkpointing
refuses it). ``TensorBlocks`` gives ``torch.distributed.checkpoint`` exactly those blocks through the protocol its
planners ask of a checkpointable tensor (``__create_write_items__``, ``__create_chunk_list__``,
``__get_tensor_shard__``, as DTensor implements it): loading reads each block straight into the parameter it views;
saving writes each block where it belongs (through the safetensors writer, which keeps one chunk of a tensor per
rank and file, ``save_hf`` offers one).
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


class TensorBlocks(torch.Tensor):
    """A tensor of ``shape`` of which this rank holds ``blocks``: (the block's offset in every dimension, a tensor
    of the block), views of the parameters they come from. Only for ``dcp.save`` / ``dcp.load``: every other
    operation is refused."""

    blocks: list[tuple[tuple[int, ...], torch.Tensor]]

    @staticmethod
    def __new__(cls, shape: tuple[int, ...], blocks: list[tuple[tuple[int, ...], torch.Tensor]]) -> TensorBlocks:
        ref = blocks[0][1]
        for offsets, block in blocks:
            if len(offsets) != len(shape) or block.dim() != len(shape) or not all(
                    0 <= o <= o + n <= whole for o, n, whole in zip(offsets, block.shape, shape)):
                raise ValueError(f"a block of {tuple(block.shape)} at {tuple(offsets)} does not lie in {tuple(shape)}")
        out = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=ref.dtype, device=ref.device)
        out.blocks = [(tuple(offsets), block) for offsets, block in blocks]
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"TensorBlocks only carries blocks to torch.distributed.checkpoint, not {func}")

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=block.shape) for offsets, block in self.blocks]

    def __create_write_items__(self, fqn: str, _obj: object) -> list[WriteItem]:
        return [WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=chunk, properties=TensorProperties.create_from_tensor(block),
                                                      size=self.shape))
                for chunk, (_, block) in zip(self.__create_chunk_list__(), self.blocks)]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        for offsets, block in self.blocks:
            if torch.Size(offsets) == index.offset:
                return block
        raise ValueError(f"{index.fqn} has no block at {index.offset} on this rank")


def local_block(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(this rank's block of ``t``, its offset in every dimension): ``t`` whole at 0, or a DTensor's local shard
    (any placements that leave a rank one block: TP and ZeRO-3 shards, each on any dimension)."""
    if not isinstance(t, DTensor):
        return t, (0,) * t.dim()
    return t.to_local(), tuple(compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)[1])
