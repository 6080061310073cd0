"""Run a function on N fork-started torch.distributed ranks (gloo, CPU) and collect the results.

Used by the runtime tests and by any feature that needs a quick multi-process job on one machine.
Why fork and a file store (DESIGN.md section 6): ranks forked from a parent that has already imported
``torch.distributed`` start in milliseconds, where torchrun / spawn pay seconds of imports per rank;
``file://`` rendezvous needs no free port. Each rank gets a short collective timeout so a rank that
raises makes its peers fail fast instead of hanging, and the parent kills the rest as soon as one
rank reports an error, re-raising that rank's traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
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
from torch import nn

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy


class RankError(RuntimeError):
    """A rank raised: the message holds its rank and traceback (the first rank to fail)."""


def _child(rank: int, world_size: int, store_path: str, timeout_s: float, conn, fn: Callable,
           args: tuple, kwargs: dict) -> None:
    status, payload = "ok", None
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
                raise RankError(f"ranks {sorted(readers.values())} did not finish within {timeout_s + 10:.0f} s")
            for r in wait(list(readers), timeout=left):
                rank = readers.pop(r)
                try:
                    status, payload = pickle.loads(r.recv_bytes())
                except EOFError:
                    procs[rank].join(1.0)
                    raise RankError(f"rank {rank} died without a result (exit code {procs[rank].exitcode})") from None
                if status == "error":
                    raise RankError(f"rank {rank} of {world_size} failed:\n{payload}")
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


# -- plans and single-device references for runtime tests ----------------------------------------

LayerArg = tuple  # (unit name, Strategy) or (unit name, dict of Strategy fields)


def cpu_cluster(n: int) -> Cluster:
    """A one-node cluster of ``n`` CPU "devices" (plans need a cluster; the runtime ignores its speeds)."""
    return Cluster(nodes=[Node(gpu=GPUType("cpu", memory_gib=16.0, tflops=1.0, hbm_gbps=50.0), count=n)])


def make_plan(pipelines: list[tuple[int, int, list[tuple[list[int], list[LayerArg]]]]],
              schedule: str = "1f1b", name: str = "test") -> Plan:
    """Plan from ``[(micro_batch_size, num_microbatches, [(devices, [(unit, strategy), ...]), ...]), ...]``."""
    pipes = []
    for mbs, m, stages in pipelines:
        sts = [Stage(devices=list(devs), layers=[StageLayer(n, s if isinstance(s, Strategy) else Strategy(**s))
                                                  for n, s in layers]) for devs, layers in stages]
        pipes.append(Pipeline(batch_share=mbs * m, micro_batch_size=mbs, num_microbatches=m, stages=sts))
    n_layers = sum(len(st.layers) for st in pipes[0].stages)
    world = sum(len(st.devices) for p in pipes for st in p.stages)
    return Plan(model=ModelRef(name, seq_len=1, num_layers=n_layers), cluster=cpu_cluster(world),
                global_batch_size=sum(p.batch_share for p in pipes), pipelines=pipes, schedule=schedule)


def _build(build: Callable[[], nn.Module], seed: int, meta: bool) -> nn.Module:
    if meta:
        with torch.device("meta"):
            return build()
    torch.manual_seed(seed)
    return build()


def reference_train(build: Callable[[], nn.Module], inputs: torch.Tensor, targets: torch.Tensor, steps: int,
                    lr: float, loss_fn: Callable | None = None, seed: int = 0, meta: bool = False,
                    ) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-process SGD on the whole batch: (losses, final parameters), the runtime's ground truth."""
    from autopar.runtime.materialize import init_weights
    from autopar.runtime.stage import cross_entropy

    model = init_weights(build(), seed) if meta else _build(build, seed, False)
    loss_fn = loss_fn or cross_entropy
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(inputs), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def _train_rank(rank: int, world: int, build, plan, inputs, targets, steps, lr, loss_fn, seed, meta):
    from autopar.runtime.wrap import wrap

    pm = wrap(_build(build, seed, meta), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=lr), loss_fn=loss_fn,
              seed=seed)
    losses = [pm.step(inputs, targets) for _ in range(steps)]
    state = pm.full_state_dict()
    return losses, (state if rank == 0 else None)


def train_distributed(build: Callable[[], nn.Module], plan: Plan | str | os.PathLike, inputs: torch.Tensor, targets: torch.Tensor,
                      steps: int = 3, lr: float = 0.1, loss_fn: Callable | None = None, seed: int = 0,
                      meta: bool = False, timeout_s: float = 30.0,
                      ) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    """``wrap`` + ``steps`` SGD steps on the plan's ranks: (losses per rank, rank 0's full state).

    ``plan`` may be a path: the ranks then hand the path itself to ``wrap``.
    """
    if isinstance(plan, Plan):
        world = plan.world_size
    else:
        from autopar.plan.io import load_plan

        world = load_plan(plan).world_size
    out = run_distributed(_train_rank, world, build, plan, inputs, targets, steps, lr, loss_fn, seed, meta,
                          timeout_s=timeout_s)
    return [losses for losses, _ in out], out[0][1]


def assert_matches_reference(build: Callable[[], nn.Module], plan: Plan | str | os.PathLike, inputs: torch.Tensor,
                             targets: torch.Tensor, *, steps: int = 3, lr: float = 0.1,
                             loss_fn: Callable | None = None, seed: int = 0, meta: bool = False,
                             tol: float = 1e-5, timeout_s: float = 30.0) -> dict:
    """Train ``steps`` SGD steps under ``plan`` and on one process; assert equal losses and parameters.

    Every rank must report the same losses; losses and every parameter must agree with the
    single-process run within ``tol`` (absolute and relative). Returns the figures for reporting.
    """
    losses, state = train_distributed(build, plan, inputs, targets, steps, lr, loss_fn, seed, meta, timeout_s)
    ref_losses, ref_state = reference_train(build, inputs, targets, steps, lr, loss_fn, seed, meta)
    for rank, ls in enumerate(losses):
        assert ls == losses[0], f"rank {rank} reports losses {ls}, rank 0 {losses[0]}"
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(ref_losses), atol=tol, rtol=tol)
    assert set(state) == set(ref_state), f"parameter names differ: {sorted(set(state) ^ set(ref_state))}"
    worst = 0.0
    for name, ref in ref_state.items():
        torch.testing.assert_close(state[name], ref, atol=tol, rtol=tol, msg=lambda m, n=name: f"{n}: {m}")
        worst = max(worst, (state[name] - ref).abs().max().item())
    return {"losses": losses[0], "ref_losses": ref_losses, "max_param_diff": worst}
