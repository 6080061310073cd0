"""Ckpt ``op``: the bytes PyTorch's selective checkpoint really keeps for a block equal the model's
``saved_bytes("op", tp, sp)`` to the byte (fp32 on CPU, flash SDPA), for GPT- and Llama-style blocks,
alone and under TP 2 with and without sequence parallelism (2 fork-started ranks, ``autopar.wrap``).

What is kept is measured without the policy's help: tensors the checkpoint saves through autograd
(its inputs, seen by an outer ``saved_tensors_hooks``) plus the tensors its cache holds after the
forward (found by ``gc``: the cache holds Python tensor objects; DTensors by their local shard), each
storage once, the output and the CPU RNG state the checkpoint stores per call (not per sample) excluded.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.distributed.tensor import DTensor

from autopar.modelspec.trace import spec_from_module
from autopar.modelspec.zoo import spec_from_entry, zoo_entry
from autopar.plan.compact import make_plan
from autopar.profile.reference import build_module
from autopar.runtime.checkpointing import apply_checkpointing
from autopar.runtime.local_ranks import run_distributed

RNG_STATE_BYTES = torch.get_rng_state().untyped_storage().nbytes()
BATCH = 2
UNITS = ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]


def _storage(t: torch.Tensor):
    return (t._local_tensor if isinstance(t, DTensor) else t).untyped_storage()


def _live_tensors() -> list[torch.Tensor]:
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on every gc object touches deprecated module attributes
        return [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and not isinstance(o, torch.nn.Parameter)]


def _kept_bytes_per_sample(unit: torch.nn.Module, hidden: int, tries: int = 3) -> float:
    """The least over ``tries`` forwards: what the checkpoint keeps is the same each time, while an object
    of the process's that happens to be alive during one forward (a collective's buffer still held by its
    work handle, a lazily built cache) is not kept by the checkpoint (it once made a CI run count 8 KiB more)."""
    return min(_kept_once(unit, hidden) for _ in range(tries))


def _kept_once(unit: torch.nn.Module, hidden: int) -> float:
    x = torch.randn(BATCH, 32, hidden, requires_grad=True)
    packed: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed[_storage(t).data_ptr()] = _storage(t).nbytes()
        return t

    alive = _live_tensors()  # held through the forward, so no new storage can reuse one of their addresses
    before = {_storage(t).data_ptr() for t in alive}
    with saved_tensors_hooks(pack, lambda t: t):
        y = unit(x)
    after = {_storage(t).data_ptr(): _storage(t).nbytes() for t in _live_tensors()}
    kept = {**{p: b for p, b in after.items() if p not in before and p != _storage(y).data_ptr()}, **packed}
    del alive
    y.sum().backward()  # the cache is consumed: the recomputation ran with what was kept
    assert x.grad is not None and torch.isfinite(x.grad).all()
    return sum(b for b in kept.values() if b != RNG_STATE_BYTES) / BATCH


def _block_spec(name: str):
    return spec_from_entry(dict(zoo_entry(name), flash=True), dtype_bytes=4).layers[1]  # CPU SDPA: flash, fp32


@pytest.mark.parametrize("mode", ["op", "full"])
@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_op_checkpoint_keeps_what_the_model_says(name, mode):
    torch.manual_seed(0)
    model = build_module(name)
    traced = spec_from_module(model, torch.randint(0, 256, (BATCH, 32)), dtype_bytes=4).layers[1]
    block = model.layers[0]
    apply_checkpointing(block, mode, ())
    kept = _kept_bytes_per_sample(block, 64)
    assert kept == _block_spec(name).saved_bytes(mode) == traced.saved_bytes(mode)


def _tp_rank(rank: int, world: int, name: str, sp: bool) -> float:
    from autopar.runtime.wrap import wrap

    torch.manual_seed(0)
    strategies = [{}] + [{"tp": 2, "sp": sp, "ckpt": "op"}] * 4 + [{}]
    plan = make_plan([(BATCH, 1, [([0, 1], list(zip(UNITS, strategies)))])])
    pm = wrap(build_module(name), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    return _kept_bytes_per_sample(pm.local_units["layers.0"], 64)


@pytest.mark.dist
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_op_checkpoint_under_tp_keeps_what_the_model_says(name, sp):
    """Column-parallel outputs and SDPA shard, row-parallel partial sums do not; SP also keeps the
    reduce-scattered outputs and shards the input."""
    kept = run_distributed(_tp_rank, 2, name, sp, timeout_s=120)
    assert kept == [_block_spec(name).saved_bytes("op", 2, sp)] * 2
