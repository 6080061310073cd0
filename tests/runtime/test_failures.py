"""Failure behaviour: bad plans are refused on every rank before any collective, a failing rank never
hangs the others, and the launcher hands the failing rank's traceback to the caller."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import RankError, run_distributed
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, MODELS, gpt, same
from tests.runtime.reference import assert_matches_reference

pytestmark = pytest.mark.dist


def _wrap_and_report(rank, world, plan):
    from autopar.runtime import wrap

    try:
        wrap(gpt(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    except AutoparError as e:
        return str(e)
    return "accepted"


@pytest.mark.parametrize("plan,words", [
    (make_plan([(4, 1, [([0, 1], same(GPT_UNITS[:3]))])]), "does not place layer unit(s) head"),
    (make_plan([(4, 1, [([0], same(GPT_UNITS))])]), "has 1 device (one process each) but the world has 2"),
    (make_plan([(3, 1, [([0, 1], same(GPT_UNITS, tp=2))]), (3, 1, [([2, 3], same(GPT_UNITS))])]), "dp = 2 devices / tp 1"),
])
def test_bad_plan_refused_identically_on_every_rank(plan, words):
    world = 2 if "world" in words else plan.world_size
    start = time.monotonic()
    msgs = run_distributed(_wrap_and_report, world, plan, timeout_s=10)
    assert time.monotonic() - start < 5
    assert len(set(msgs)) == 1 and words in msgs[0], msgs


def _one_rank_raises(rank, world):
    if rank == 1:
        raise ValueError("rank 1 broke on purpose")
    dist.barrier()  # would wait forever for rank 1
    return rank


def test_failing_rank_stops_the_job_with_its_error():
    start = time.monotonic()
    with pytest.raises(RankError, match="rank 1 broke on purpose"):
        run_distributed(_one_rank_raises, 3, timeout_s=20)
    assert time.monotonic() - start < 5, "the launcher must not wait for the collective timeout"


def _waits_in_a_named_place(seconds):
    time.sleep(seconds)


def _one_rank_raises_while_another_waits(rank, world):
    if rank == 1:
        raise ValueError("rank 1 broke on purpose")
    if rank == 0:
        _waits_in_a_named_place(20.0)  # not in a collective: it would time out only after 20 s
    return rank


def test_the_error_shows_where_the_ranks_still_running_were():
    """A timeout or a hang is explained by the other ranks' stacks: the parent has each rank still alive dump
    its Python stack (faulthandler) before killing it, and puts them under the failing rank's traceback."""
    start = time.monotonic()
    with pytest.raises(RankError) as err:
        run_distributed(_one_rank_raises_while_another_waits, 3, timeout_s=20)
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert "rank 1 broke on purpose" in message
    head, _, stacks = message.partition("rank 0 (still running) was at:")
    assert "_waits_in_a_named_place" in stacks and "_one_rank_raises_while_another_waits" in stacks


def _results(rank, world, scale):
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    return {"rank": rank, "sum": t * scale}


def test_run_distributed_returns_results_by_rank():
    out = run_distributed(_results, 3, 2.0)
    assert [o["rank"] for o in out] == [0, 1, 2]
    assert all(torch.equal(o["sum"], torch.full((2,), 12.0)) for o in out)


def test_step_refuses_a_wrong_batch():
    def fn(rank, world):
        from autopar.runtime import wrap

        build, _, (x, y), loss_fn = MODELS["mlp"]
        torch.manual_seed(0)
        pm = wrap(build(), make_plan([(4, 2, [([0, 1], same(MLP_UNITS))])]), loss_fn=loss_fn,
                  optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
        try:
            pm.step(x[:6], y[:6])
        except AutoparError as e:
            return str(e)

    msgs = run_distributed(fn, 2)
    assert "global_batch_size 8" in msgs[0] and msgs[0] == msgs[1]


def test_plan_from_a_yaml_file(tmp_path):
    """``wrap`` also takes a plan path (read with autopar.plan.io.load_plan)."""
    io = pytest.importorskip("autopar.plan.io")
    build, _, (x, y), loss_fn = MODELS["gpt"]
    plan = make_plan([(2, 2, [([0], same(GPT_UNITS[:2])), ([1], same(GPT_UNITS[2:], zero=1))]),
                      (4, 1, [([2], same(GPT_UNITS))])])
    path = io.save_plan(plan, tmp_path / "plan.yaml")
    assert_matches_reference(build, path, x, y, loss_fn=loss_fn)
