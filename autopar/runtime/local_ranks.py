"""Run a function on N fork-started torch.distributed ranks (gloo, CPU) and collect the results.

Used by ``autopar profile`` (timed runs on this machine) and by the runtime tests. Why fork and a
file store: ranks forked from a parent that has already imported
``torch.distributed`` start in milliseconds, where torchrun / spawn pay seconds of imports per rank;
``file://`` rendezvous needs no free port. Each rank gets a short collective timeout so a rank that
raises makes its peers fail fast instead of hanging, and the parent kills the rest as soon as one
rank reports an error, re-raising that rank's traceback with the Python stacks of the ranks still
running (faulthandler on SIGUSR1): where the others were is what explains a timeout or a hang.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

import torch
import torch._dynamo  # noqa: F401  (lazily imported by the first optimizer: ~1 s per rank if not done here)
import torch.distributed as dist
import torch.distributed.fsdp  # noqa: F401  (imported in the parent so forked ranks start fast)
import torch.distributed.tensor  # noqa: F401
import torch.distributed.tensor.parallel  # noqa: F401
import torch.utils.checkpoint  # noqa: F401


class RankError(RuntimeError):
    """A rank raised: the message holds its rank and traceback (the first rank to fail)."""


def _stack_file(store_path: str, rank: int) -> str:
    return f"{store_path}.stack{rank}"


def _child(rank: int, world_size: int, store_path: str, timeout_s: float, conn, fn: Callable,
           args: tuple, kwargs: dict) -> None:
    status, payload = "ok", None
    stacks = open(_stack_file(store_path, rank), "w")  # noqa: SIM115  (open until os._exit)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)  # the signal may land on any thread
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        payload = fn(rank, world_size, *args, **kwargs)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (every failure must reach the parent as text)
        status, payload = "error", traceback.format_exc()
    try:
        conn.send_bytes(pickle.dumps((status, payload)))
    except Exception:  # noqa: BLE001  (an unpicklable result is reported as an error)
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
    conn.close()
    os._exit(0)  # skip the parent's atexit handlers (pytest) inherited through fork


def _dead_rank(procs: list, readers: dict, grace_s: float = 0.5) -> int | None:
    """A rank still awaited that was killed (a signal, no result), within ``grace_s``; None if none."""
    end = time.monotonic() + grace_s
    while True:
        codes = {rank: procs[rank].exitcode for rank in sorted(readers.values())}
        killed = [rank for rank, code in codes.items() if code is not None and code < 0]
        if killed:
            return killed[0]
        if time.monotonic() >= end or all(code is not None for code in codes.values()):
            return None
        time.sleep(0.02)


def _stacks_of_the_rest(procs: list, waiting: list[int], store_path: str, settle_s: float = 0.5) -> str:
    """The Python stacks of the ranks in ``waiting`` still alive, each dumped by its faulthandler on SIGUSR1
    (read once it stops growing, within ``settle_s``); empty when none is alive."""
    pending = [rank for rank in waiting if procs[rank].is_alive()]
    for rank in pending:
        os.kill(procs[rank].pid, signal.SIGUSR1)
    seen: dict[int, str] = {}
    done: dict[int, str] = {}
    end = time.monotonic() + settle_s
    while pending and time.monotonic() < end:
        time.sleep(0.01)
        for rank in list(pending):
            with open(_stack_file(store_path, rank)) as f:
                text = f.read().strip()
            if text and text == seen.get(rank):  # written, and unchanged for one poll
                done[rank] = text
                pending.remove(rank)
            elif not text and not procs[rank].is_alive():  # it finished before the signal came
                pending.remove(rank)
            seen[rank] = text
    return "".join(f"\nrank {rank} (still running) was at:\n{text}" for rank, text in sorted(done.items()))


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 30.0,
                    **kwargs: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` gloo ranks; return the results by rank.

    The process group is initialised before ``fn`` and barrier + destroyed after it. ``timeout_s``
    is both the collective timeout inside the ranks and (plus a margin) the wall-clock limit of the
    whole job. Results must be picklable (tensors are fine). Raises ``RankError`` with the first
    failing rank's traceback, after killing the other ranks.
    """
    torch.set_num_threads(1)
    ctx = mp.get_context("fork")
    tmpdir = tempfile.mkdtemp(prefix="autopar-dist-")
    store_path = os.path.join(tmpdir, "store")
    procs, readers = [], {}
    try:
        for rank in range(world_size):
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(rank, world_size, store_path, timeout_s, w, fn, args, kwargs),
                            daemon=True)
            p.start()
            w.close()
            procs.append(p)
            readers[r] = rank
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s + 10.0
        while readers:
            left = deadline - time.monotonic()
            if left <= 0:
                late = sorted(readers.values())
                raise RankError(f"ranks {late} did not finish within {timeout_s + 10:.0f} s"
                                + _stacks_of_the_rest(procs, late, store_path))
            for r in wait(list(readers), timeout=left):
                rank = readers.pop(r)
                try:
                    status, payload = pickle.loads(r.recv_bytes())
                except EOFError:
                    procs[rank].join(1.0)
                    raise RankError(f"rank {rank} died without a result (exit code {procs[rank].exitcode})") from None
                if status == "error":
                    dead = _dead_rank(procs, readers)  # a peer's death is the cause its partners report
                    if dead is not None:
                        raise RankError(f"rank {dead} died without a result (exit code {procs[dead].exitcode}); "
                                        f"rank {rank} of {world_size} then failed:\n{payload}")
                    raise RankError(f"rank {rank} of {world_size} failed:\n{payload}"
                                    + _stacks_of_the_rest(procs, sorted(readers.values()), store_path))
                results[rank] = payload
        return [results[i] for i in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5.0)
        for f in os.listdir(tmpdir):
            os.unlink(os.path.join(tmpdir, f))
        os.rmdir(tmpdir)
