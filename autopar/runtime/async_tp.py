"""Async TP in the runtime: PyTorch's micro-pipelined tensor parallelism for the units whose strategy asks for it.

Async TP is an exact re-association of the same collectives: each sequence-parallel all-gather feeding a
column-parallel matmul, and each reduce-scatter fed by a row-parallel one, is split into tp steps that
overlap the matmul's chunks. Every output element is the same sum of the same products, so the
numbers are those of plain TP (autopar's tests hold an async-TP plan to the vanilla TP plan and to one
process).

* On CPU (gloo) there is no symmetric memory and no inductor pass to decompose anything: the plan runs as
  plain TP, with the same numbers, and rank 0 logs that it does (the plan's predicted figures describe
  the GPUs it was planned for).
* On CUDA with NCCL and ``wrap(compile=True)`` (the inductor backend): ``torch._inductor.config.
  _micro_pipeline_tp`` is set and symmetric memory is enabled for each async-TP unit's TP group, as
  torchtitan's ``enable_async_tensor_parallel`` does; inductor then fuses the collectives with their
  matmuls when it compiles the unit.
* On CUDA without compilation (or another backend) the micro-pipelining cannot happen; running plain TP
  there would make the plan's predicted step time silently wrong, so ``wrap`` refuses with one line
  naming the units and both fixes (compile, or ``async_tp: false``: plain TP, the same numbers).
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autopar.errors import AutoparError
from autopar.plan.schema import Plan

log = logging.getLogger(__name__)


def async_tp_units(plan: Plan) -> list[str]:
    """The units any pipeline runs with ``async_tp``, in plan order, each once."""
    return list(dict.fromkeys(ly.name for st in plan.stages for ly in st.layers if ly.strategy.async_tp))


def _names(units: list[str]) -> str:
    return ", ".join(units[:3]) + (f" and {len(units) - 3} more" if len(units) > 3 else "")


def prepare_async_tp(plan: Plan, device: torch.device, compile_kwargs: dict | None, rank: int) -> bool:
    """Whether this rank micro-pipelines its async-TP units (True: CUDA, NCCL, inductor compilation, and
    ``_micro_pipeline_tp`` is now set); False when the plan has none or runs them as plain TP (logged on
    rank 0). Raises AutoparError, the same on every rank, on CUDA when they cannot be micro-pipelined."""
    units = async_tp_units(plan)
    if not units:
        return False
    if device.type != "cuda":
        if rank == 0:
            log.warning("autopar: async TP (units %s) runs as plain TP on %s with %s: the same collectives and "
                        "the same numbers; only CUDA with NCCL and compile=True micro-pipelines them",
                        _names(units), device.type, dist.get_backend())
        return False
    backend = (compile_kwargs or {}).get("backend", "inductor")
    if compile_kwargs is None or backend != "inductor":
        why = "compile=False" if compile_kwargs is None else f"the {backend!r} compile backend"
        raise AutoparError("compile", f"the plan runs async TP on unit(s) {_names(units)}, which on CUDA needs "
                           f"torch.compile's inductor pass (_micro_pipeline_tp), not {why}",
                           "pass compile=True to wrap, or set async_tp: false on those units (plain TP, same numbers)")
    if dist.get_backend() != "nccl":
        raise AutoparError("async_tp", f"unit(s) {_names(units)} run async TP on CUDA over {dist.get_backend()}: "
                           "its symmetric memory needs NCCL", "initialise the process group with nccl, or set "
                           "async_tp: false on those units")
    torch._inductor.config._micro_pipeline_tp = True
    return True


def enable_symmetric_memory(mesh: DeviceMesh) -> None:
    """Enable symmetric memory for the TP group of ``mesh`` (1-D), which inductor's micro-pipeline pass
    requires before it fuses a collective of that group (torch 2.13 deprecates the call but still
    checks what it registers)."""
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        enable_symm_mem_for_group(mesh.get_group().group_name)
