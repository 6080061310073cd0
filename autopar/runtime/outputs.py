"""Forward-only results gathered on every rank: the global mean loss, or the model's whole output.

Each global-batch row ends on exactly one rank of one pipeline's last stage: the TP coordinate 0
member of the DP chunk holding it (``StageRunner.reports_loss``). ``gather_outputs`` first lets the
ranks agree on the output's trailing shape and dtype (one small all-reduce), then each reporting
rank writes its rows into a zero tensor of the whole batch and one all-reduce (a sum: every other
rank adds zeros) gives every rank the whole output, exactly as the reporting ranks computed it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.runtime.stage import StageRunner

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32]
_MAX_DIMS = 8


def global_loss(loss_sum: torch.Tensor) -> float:
    """Collective: the sum of every rank's weighted loss (the global mean loss), as a float on every rank."""
    total = loss_sum.detach().reshape(()).to(torch.float64)
    dist.all_reduce(total)
    return total.item()


@torch.no_grad()
def gather_outputs(runner: StageRunner, outputs: dict[int, torch.Tensor], global_batch: int,
                   device: torch.device) -> torch.Tensor:
    """Collective: the model's output for the whole global batch, on every rank (rows in batch order)."""
    last = runner.units[-1].layout
    # Vocabulary-sharded logits (loss_parallel heads) are gathered inside their TP group first.
    rows = {k: (x.full_tensor() if isinstance(x, DTensor) else x) for k, x in outputs.items()}
    header = torch.zeros(3 + _MAX_DIMS, dtype=torch.int64, device=device)
    if runner.reports_loss and rows:
        x = next(iter(rows.values()))
        if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES or x.dim() - 1 > _MAX_DIMS:
            header[0] = 2
        else:
            header[0], header[1], header[2] = 1, _DTYPES.index(x.dtype), x.dim() - 1
            header[3:3 + x.dim() - 1] = torch.tensor(x.shape[1:], dtype=torch.int64)
    dist.all_reduce(header, op=dist.ReduceOp.MAX)
    code, dtype_i, ndim = header[:3].tolist()
    if code != 1:
        raise AutoparError("predict", "the model's output is not a single float or integer tensor",
                           "return one tensor from the last unit (predict gathers tensors only)")
    trailing = tuple(header[3:3 + ndim].tolist())
    dtype = _DTYPES[dtype_i]
    wire = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype  # exact; every backend sums it
    full = torch.zeros((global_batch, *trailing), dtype=wire, device=device)
    if runner.reports_loss:
        for k, x in rows.items():
            full[runner._rows(last, k)] = x.to(wire)
    dist.all_reduce(full)
    return full.to(dtype)
