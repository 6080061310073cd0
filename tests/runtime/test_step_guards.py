"""``step``'s guards: a NaN/inf loss or gradient raises on every rank naming the step (or the step is
skipped with ``on_nonfinite="skip"``), ranks passing different batches are refused, and a rank killed
mid-training ends the job in seconds."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import RankError, run_distributed
from tests.runtime.cases import MLP_UNITS, MODELS, mse, same
from tests.runtime.reference import reference_train

pytestmark = pytest.mark.dist
BUILD, _, (X, Y), _ = MODELS["mlp"]
# ZeRO-1, DDP, ZeRO-2 and ZeRO-3 units in a 2-way data-parallel stage: every optimizer path skips.
MIXED = make_plan([(4, 2, [([0, 1], [("0", {"zero": 1}), ("1", {}), ("2", {"zero": 2}), ("3", {}),
                                      ("4", {"zero": 3})])])])
PIPE = make_plan([(2, 4, [([0], same(MLP_UNITS[:3])), ([1], same(MLP_UNITS[3:], zero=1))])])


def _nan_row(x: torch.Tensor) -> torch.Tensor:
    bad = x.clone()
    bad[5, 2] = float("nan")  # one row: only the ranks that run it see a NaN loss of their own
    return bad


def _train(rank, world, plan, batches, kwargs, build=BUILD):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    losses = []
    try:
        pm = wrap(build(), plan, loss_fn=mse, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), **kwargs)
        for x, y in batches(rank):
            losses.append(pm.step(x, y))
    except AutoparError as e:
        return str(e), losses
    return pm.skipped_steps, losses, pm.full_state_dict()


@pytest.mark.parametrize("plan", [MIXED, PIPE], ids=["dp-zero-mix", "pipeline"])
def test_nan_loss_raises_on_every_rank_naming_the_step(plan):
    start = time.monotonic()
    out = run_distributed(_train, 2, plan, lambda r: [(X, Y), (_nan_row(X), Y), (X, Y)], {}, timeout_s=30)
    assert time.monotonic() - start < 5
    assert {o[0] for o in out} == {"step: non-finite loss (nan) at step 2; check this step's batch and the learning "
                                   "rate, or pass wrap(..., on_nonfinite='skip') to skip such steps"}, out
    assert all(len(o[1]) == 1 for o in out)


@pytest.mark.parametrize("plan", [MIXED, PIPE], ids=["dp-zero-mix", "pipeline"])
def test_skip_leaves_the_parameters_unchanged_for_that_step(plan):
    out = run_distributed(_train, 2, plan, lambda r: [(X, Y), (_nan_row(X), Y), (X, Y)], {"on_nonfinite": "skip"})
    ref_losses, ref_params = reference_train(BUILD, X, Y, 2, 0.1, loss_fn=mse)
    for skipped, losses, state in out:
        assert skipped == [2]
        assert losses[0] == pytest.approx(ref_losses[0], rel=1e-5) and losses[1] != losses[1]  # NaN
        assert losses[2] == pytest.approx(ref_losses[1], rel=1e-5)
        for k, v in ref_params.items():
            torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-5)


class _InfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * float("inf")


class InfGrad(nn.Module):
    """Identity forward, infinite gradient backward: a finite loss with non-finite gradients."""

    def forward(self, x):
        return _InfGrad.apply(x)


def _inf_grad_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 5), InfGrad(), nn.Linear(5, 3))


def test_non_finite_gradients_with_a_finite_loss_name_the_ranks():
    plan = make_plan([(2, 4, [([0], same(["0", "1"])), ([1], same(["2"]))])])
    out = run_distributed(_train, 2, plan, lambda r: [(X, Y)], {}, build=_inf_grad_mlp)
    msg = out[0][0]
    assert out[1][0] == msg and msg.startswith("step: non-finite gradients at step 1 on rank 0 (loss "), out


def test_invalid_on_nonfinite_is_refused():
    out = run_distributed(_train, 2, MIXED, lambda r: [], {"on_nonfinite": "ignore"})
    assert {o[0] for o in out} == {"on_nonfinite: unknown value 'ignore'; use 'raise' or 'skip'"}


def _shuffled_on_rank_1(rank):
    perm = torch.arange(X.shape[0]).flip(0)
    return [(X, Y), (X[perm] if rank == 1 else X, Y[perm] if rank == 1 else Y)]


@pytest.mark.parametrize("batches,words", [
    (_shuffled_on_rank_1, "step inputs: ranks passed different inputs at step 2 (ranks 0, 2 vs rank 1)"),
    (lambda r: [(X, Y + (r == 2))], "step inputs: ranks passed different targets at step 1 (ranks 0-1 vs rank 2)"),
    (lambda r: [(X, Y[:, :2] if r == 0 else Y)], "different targets at step 1 (rank 0 vs ranks 1-2)"),
    (lambda r: [(X[:6] if r == 1 else X, Y)], "different inputs at step 1 (ranks 0, 2 vs rank 1)"),
])
def test_different_batches_are_refused_on_every_rank(batches, words):
    plan = make_plan([(2, 2, [([0, 1], same(MLP_UNITS))]), (4, 1, [([2], same(MLP_UNITS))])])
    start = time.monotonic()
    out = run_distributed(_train, 3, plan, batches, {}, timeout_s=30)
    assert time.monotonic() - start < 5
    assert len({o[0] for o in out}) == 1 and words in out[0][0], out


def _killed_at_step_2(rank, world):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(BUILD(), PIPE, loss_fn=mse, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    for step in range(1, 4):
        if step == 2 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        pm.step(X, Y)


def test_a_rank_killed_mid_training_ends_the_job():
    start = time.monotonic()
    with pytest.raises(RankError, match="rank 1 died without a result"):
        run_distributed(_killed_at_step_2, 2, timeout_s=30)
    assert time.monotonic() - start < 5


def _peer_of_a_dead_rank(rank, store, conn):
    from datetime import timedelta

    import torch.distributed as dist

    from autopar.runtime import wrap

    start = time.monotonic()
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=60))
        pm = wrap(BUILD(), PIPE, loss_fn=mse, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
        for step in range(1, 4):
            if step == 2 and rank == 1:
                os._exit(3)  # dies without a word, mid-training
            pm.step(X, Y)
        conn.send("finished")
    except Exception as e:  # noqa: BLE001
        conn.send((time.monotonic() - start, str(e)))
    finally:
        os._exit(0)


def test_the_peers_of_a_killed_rank_fail_on_their_own_in_seconds(tmp_path):
    """No launcher to kill them: rank 0's next exchange with the dead rank fails, far below the timeout."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_peer_of_a_dead_rank, args=(r, str(tmp_path / "store"), pipes[r][1]), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = pipes[0][0].recv() if pipes[0][0].poll(30) else "no answer in 30 s"
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    assert isinstance(got, tuple) and got[0] < 10, got  # gloo: "Connection reset by peer" at once
