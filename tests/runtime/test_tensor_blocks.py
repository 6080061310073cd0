"""TensorBlocks: a rank's blocks of a checkpoint tensor, through torch.distributed.checkpoint's own planners
(autopar.runtime.tensor_blocks). Two ranks save a tensor as interleaved blocks of rows or of columns (what TP leaves
of a fused projection, of GPT-2's transposed one) and load it back under another split; local_block gives a
DTensor shard's offsets."""

from __future__ import annotations

import pytest
import torch

from autopar.runtime.local_ranks import run_distributed
from autopar.runtime.tensor_blocks import TensorBlocks, local_block

pytestmark = pytest.mark.dist

WHOLE = torch.arange(24 * 3, dtype=torch.float32).reshape(24, 3)


def _save_then_load(rank, world, path, dim):
    import torch.distributed.checkpoint as dcp

    whole = WHOLE if dim == 0 else WHOLE.t().contiguous()

    def at(i: int) -> tuple[int, int]:
        return (i, 0) if dim == 0 else (0, i)

    # saved: rank r holds indices [4r, 4r + 4) along dim of each of three parts of 8 (parts at 0, 8, 16)
    mine = [(at(s + 4 * rank), whole.narrow(dim, s + 4 * rank, 4).clone()) for s in (0, 8, 16)]
    dcp.save({"w": TensorBlocks(tuple(whole.shape), mine)}, storage_writer=dcp.FileSystemWriter(path))
    # loaded: rank r reads [12r, 12r + 12) as two blocks of 6, into fresh tensors
    blocks = [(at(12 * rank + 6 * i), torch.zeros(whole.narrow(dim, 0, 6).shape)) for i in range(2)]
    dcp.load({"w": TensorBlocks(tuple(whole.shape), blocks)}, storage_reader=dcp.FileSystemReader(path))
    return blocks


@pytest.mark.parametrize("dim", [0, 1])
def test_blocks_saved_interleaved_load_back_under_another_split(dim, tmp_path):
    whole = WHOLE if dim == 0 else WHOLE.t()
    for blocks in run_distributed(_save_then_load, 2, str(tmp_path / "ckpt"), dim):
        for offsets, t in blocks:
            torch.testing.assert_close(t, whole.narrow(dim, offsets[dim], t.shape[dim]), atol=0, rtol=0)


def test_a_block_outside_the_tensor_is_refused_and_no_op_runs_on_it():
    with pytest.raises(ValueError, match="does not lie in"):
        TensorBlocks((4, 3), [((2, 0), torch.zeros(3, 3))])
    with pytest.raises(ValueError, match="does not lie in"):
        TensorBlocks((4, 3), [((0, 1), torch.zeros(4, 3))])
    t = TensorBlocks((4, 3), [((0, 0), torch.zeros(2, 3))])
    assert t.shape == (4, 3) and t.dtype == torch.float32
    with pytest.raises(NotImplementedError, match="only carries blocks"):
        t + 1


def _local_blocks(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2))
    t = distribute_tensor(WHOLE, mesh, [Shard(0), Shard(1)])  # (an uneven split of the 3 columns: 2 and 1)
    local, offsets = local_block(t)
    return offsets, local


def test_local_block_is_a_dtensor_shard_at_its_offsets():
    seen = run_distributed(_local_blocks, 4)
    for offsets, local in seen:
        torch.testing.assert_close(local, WHOLE[offsets[0]:offsets[0] + local.shape[0],
                                                offsets[1]:offsets[1] + local.shape[1]], atol=0, rtol=0)
    assert sorted(o for o, _ in seen) == [(0, 0), (0, 2), (12, 0), (12, 2)]
    assert local_block(WHOLE) == (WHOLE, (0, 0))
