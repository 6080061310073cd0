"""Communication profile: collective and point-to-point times over message sizes and group sizes.

Runs inside every rank of the profiling job. For each group size g = 2 .. world, the first g ranks
form a group and time all-reduce, all-gather, reduce-scatter, all-to-all and a p2p send (rank 0 to
rank 1, timed as half a ping-pong) at each message size; the other ranks wait. A point is ``reps``
calls back to back, per call, as the slowest rank saw it. Sizes are bytes as ``cost_models.communication``
counts them (all-reduce / reduce-scatter / all-to-all: the buffer each rank holds; all-gather: the
gathered output; p2p: the message). On GPUs the collectives run over NCCL (one device per rank), on
CPUs over gloo, the backends the runtime uses.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from autopar.profile.compute import sync
from autopar.profile.quiet import quietly

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "alltoall", "p2p")


def _op(kind: str, nbytes: int, g: int, group, device: torch.device, dtype=torch.float32):
    """A zero-argument callable running one ``kind`` collective of ``nbytes`` over ``group``."""
    esize = torch.tensor([], dtype=dtype).element_size()
    numel = max(g, (nbytes // esize) // g * g)  # divisible by the group size (even shards)
    buf = torch.ones(numel, dtype=dtype, device=device)
    if kind == "allreduce":
        return lambda: dist.all_reduce(buf, group=group)
    if kind == "allgather":
        shard = buf[: numel // g].clone()
        return lambda: dist.all_gather_single(buf, shard, group=group)
    if kind == "reduce_scatter":
        out = torch.empty(numel // g, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_single(out, buf, group=group)
    if kind == "alltoall":
        out = torch.empty_like(buf)
        return lambda: dist.all_to_all_single(out, buf, group=group)
    raise ValueError(kind)


def _timed(fn, device, reps: int, group) -> float:
    """Seconds per call of ``reps`` back-to-back calls after a barrier, the slowest rank's view.

    Back to back, as the runtime issues one collective per unit: per-call timing after a barrier
    would charge each call the skew with which ranks leave the barrier.
    """
    fn()  # warm-up: connections, buffers
    dist.barrier(group=group)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    t = torch.tensor([(time.perf_counter() - t0) / reps], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def _p2p(nbytes: int, device: torch.device, reps: int, group, rank: int) -> float:
    """One-way time of an ``nbytes`` message between group ranks 0 and 1 (half a ping-pong)."""
    buf = torch.ones(max(1, nbytes // 4), device=device)
    peer0, peer1 = dist.get_global_rank(group, 0), dist.get_global_rank(group, 1)

    def pingpong():
        if rank == peer0:
            dist.send(buf, peer1, group=group)
            dist.recv(buf, peer1, group=group)
        elif rank == peer1:
            dist.recv(buf, peer0, group=group)
            dist.send(buf, peer0, group=group)

    return _timed(pingpong, device, reps, group) / 2.0


def measure_comm(rank: int, world: int, sizes: list[int], device: torch.device, reps: int,
                 backend: str | None = None, progress=None, tries: int = 3) -> dict[int, dict[str, list[float]]]:
    """{group size: {collective: seconds per size}} (rank 0's view; every rank must call this)."""
    out: dict[int, dict[str, list[float]]] = {}
    for g in range(2, world + 1):
        group = dist.new_group(list(range(g)), backend=backend)  # every rank takes part in creating it
        res = {k: [] for k in COLLECTIVES}
        res["others_share"] = []
        for nbytes in sizes:
            # small messages are quick and jittery: more calls per point (about 20 MB moved per point)
            n_calls = max(reps, min(100, (20 << 20) // max(nbytes, 1)))

            def one_size(nbytes=nbytes, group=group, g=g, n_calls=n_calls):
                if rank >= g:
                    return {}
                got = {kind: _timed(_op(kind, nbytes, g, group, device), device, n_calls, group)
                       for kind in COLLECTIVES[:-1]}
                got["p2p"] = _p2p(nbytes, device, n_calls, group, rank)
                return got
            got, others = quietly(one_size, tries=tries)  # all ranks: again while other processes interfere
            for kind, t in got.items():
                res[kind].append(t)
            res["others_share"].append(others)
            if progress is not None:
                progress.update(1)
        if rank < g:
            out[g] = res
    return out
