"""Process group and device from the environment: cuda + nccl when GPUs are visible, else cpu + gloo."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from autopar.errors import AutoparError


def ensure_process_group(timeout_s: float) -> None:
    """Initialise torch.distributed from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT) if needed,
    with collective timeout ``timeout_s`` (a fault then ends the job in that time, not torch's 30 min)."""
    if dist.is_initialized():
        return
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise AutoparError("torch.distributed", "no process group is initialised and RANK / WORLD_SIZE are not "
                           "set", "call torch.distributed.init_process_group first or start with torchrun")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))


def runtime_device() -> torch.device:
    """The device this rank computes on: its CUDA device under nccl, else the CPU."""
    if "nccl" in str(dist.get_backend()) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
