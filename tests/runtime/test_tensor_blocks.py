"""RowBlocks: a rank's blocks of rows of a checkpoint tensor, through torch.distributed.checkpoint's own planners
(autopar.runtime.row_blocks). Two ranks save a tensor as interleaved blocks (what TP leaves of a fused projection)
and load it back under another split."""

from __future__ import annotations

import pytest
import torch

from autopar.runtime.local_ranks import run_distributed
from autopar.runtime.row_blocks import RowBlocks

pytestmark = pytest.mark.dist

WHOLE = torch.arange(24 * 3, dtype=torch.float32).reshape(24, 3)


def _save_then_load(rank, world, path):
    import torch.distributed.checkpoint as dcp

    # saved: rank r holds rows [4r, 4r + 4) of each of three parts of 8 rows (parts at 0, 8, 16)
    mine = [(start + 4 * rank, WHOLE[start + 4 * rank:start + 4 * rank + 4].clone()) for start in (0, 8, 16)]
    dcp.save({"w": RowBlocks(tuple(WHOLE.shape), mine)}, storage_writer=dcp.FileSystemWriter(path))
    # loaded: rank r reads rows [12r, 12r + 12) as two blocks of 6, into fresh tensors
    blocks = [(12 * rank + 6 * i, torch.zeros(6, 3)) for i in range(2)]
    dcp.load({"w": RowBlocks(tuple(WHOLE.shape), blocks)}, storage_reader=dcp.FileSystemReader(path))
    return [(row, t) for row, t in blocks]


def test_blocks_saved_interleaved_load_back_under_another_split(tmp_path):
    for blocks in run_distributed(_save_then_load, 2, str(tmp_path / "ckpt")):
        for row, t in blocks:
            torch.testing.assert_close(t, WHOLE[row:row + t.shape[0]], atol=0, rtol=0)


def test_a_block_outside_the_tensor_is_refused_and_no_op_runs_on_it():
    with pytest.raises(ValueError, match="does not lie in"):
        RowBlocks((4, 3), [(2, torch.zeros(3, 3))])
    t = RowBlocks((4, 3), [(0, torch.zeros(2, 3))])
    assert t.shape == (4, 3) and t.dtype == torch.float32
    with pytest.raises(NotImplementedError, match="only carries blocks"):
        t + 1
