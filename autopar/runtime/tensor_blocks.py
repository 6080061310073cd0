"""A checkpoint tensor of which this rank holds blocks of rows that no DTensor placement describes.

A fused projection held as parts (autopar.models.hf_fused) is saved as one tensor: under TP a rank's share of it
is a block of each part, rows ``[offset_i + first, offset_i + first + n)`` for every part i, which a plain
``Shard(0)`` cannot say (torch's strided placement says it, and its checkpointing refuses it). ``RowBlocks`` gives
``torch.distributed.checkpoint`` exactly those blocks through the protocol its planners ask of a checkpointable
tensor (``__create_write_items__``, ``__create_chunk_list__``, ``__get_tensor_shard__``, as DTensor implements
it): loading reads each block straight into the parameter it views; saving writes each block where it belongs
(through the safetensors writer, which keeps one chunk of a tensor per rank and file, ``save_hf`` offers one).
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType


class RowBlocks(torch.Tensor):
    """A tensor of ``shape`` of which this rank holds ``blocks``: (first row, a tensor of those rows and every
    other dimension whole), views of the parameters they come from. Only for ``dcp.save`` / ``dcp.load``: every
    other operation is refused."""

    blocks: list[tuple[int, torch.Tensor]]

    @staticmethod
    def __new__(cls, shape: tuple[int, ...], blocks: list[tuple[int, torch.Tensor]]) -> RowBlocks:
        ref = blocks[0][1]
        for row, block in blocks:
            if tuple(block.shape[1:]) != tuple(shape[1:]) or not 0 <= row <= row + block.shape[0] <= shape[0]:
                raise ValueError(f"a block of {tuple(block.shape)} at row {row} does not lie in {tuple(shape)}")
        out = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=ref.dtype, device=ref.device)
        out.blocks = list(blocks)
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"RowBlocks only carries blocks to torch.distributed.checkpoint, not {func}")

    def _offsets(self, row: int) -> torch.Size:
        return torch.Size([row] + [0] * (len(self.shape) - 1))

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=self._offsets(row), sizes=block.shape) for row, block in self.blocks]

    def __create_write_items__(self, fqn: str, _obj: object) -> list[WriteItem]:
        return [WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=chunk, properties=TensorProperties.create_from_tensor(block),
                                                      size=self.shape))
                for chunk, (_, block) in zip(self.__create_chunk_list__(), self.blocks)]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        for row, block in self.blocks:
            if self._offsets(row) == index.offset:
                return block
        raise ValueError(f"{index.fqn} has no block at {index.offset} on this rank")
