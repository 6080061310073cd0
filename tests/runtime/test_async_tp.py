"""Async TP on CPU: the plan runs as plain TP (the same collectives, the same numbers), said in the log;
on CUDA without torch.compile's inductor pass it is refused with one line."""

from __future__ import annotations

import logging

import pytest
import torch

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.runtime.async_tp import async_tp_units, prepare_async_tp
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import GPT_UNITS, MODELS, same
from tests.runtime.reference import assert_matches_reference, train_distributed

pytestmark = pytest.mark.dist


def _plan(model: str, async_tp: bool, mbs: int = 4, m: int = 2):
    units = MODELS[model][1]
    return make_plan([(mbs, m, [([0, 1], same(units, tp=2, sp=True, async_tp=async_tp))])])


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_async_tp_trains_exactly_like_plain_tp_and_one_process(model):
    """Bit for bit the vanilla TP + SP plan's losses and parameters, and within 1e-5 of one process."""
    build, _, (x, y), _ = MODELS[model]
    atp_losses, atp_state = train_distributed(build, _plan(model, True), x, y)
    tp_losses, tp_state = train_distributed(build, _plan(model, False), x, y)
    assert atp_losses == tp_losses
    assert set(atp_state) == set(tp_state)
    for k in tp_state:
        assert torch.equal(atp_state[k], tp_state[k]), k
    assert_matches_reference(build, _plan(model, True), x, y)


def _rank_log(rank, world, plan):
    from autopar.runtime import wrap

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logger = logging.getLogger("autopar.runtime.async_tp")
    logger.addHandler(handler)
    build, _, (x, y), _ = MODELS["gpt"]
    torch.manual_seed(0)
    pm = wrap(build(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    pm.step(x, y)
    logger.removeHandler(handler)
    return records


def test_cpu_run_says_it_runs_plain_tp():
    """Rank 0 logs one line naming the units and that the numbers are plain TP's; rank 1 logs nothing."""
    units = [(u, {"tp": 2, "sp": True, "async_tp": u != "embed"}) if u != "embed" else (u, {"tp": 2})
             for u in GPT_UNITS]
    got = run_distributed(_rank_log, 2, make_plan([(4, 2, [([0, 1], units)])]), timeout_s=60)
    assert len(got[0]) == 1 and got[1] == []
    assert "layers.0, layers.1, head" in got[0][0] and "runs as plain TP on cpu with gloo" in got[0][0]


def test_cuda_without_inductor_is_refused():
    """On CUDA the micro-pipelining is inductor's pass: compile=False or another backend is one line
    naming the units and both fixes (checked before any CUDA call)."""
    plan = _plan("gpt", True)
    assert async_tp_units(plan) == GPT_UNITS
    cuda = torch.device("cuda")
    with pytest.raises(AutoparError, match=r"compile: the plan runs async TP on unit\(s\) .*not compile=False") as e:
        prepare_async_tp(plan, cuda, None, 0)
    assert "pass compile=True to wrap, or set async_tp: false" in str(e.value)
    with pytest.raises(AutoparError, match="not the 'aot_eager' compile backend"):
        prepare_async_tp(plan, cuda, {"backend": "aot_eager"}, 0)
    assert prepare_async_tp(_plan("gpt", False), cuda, None, 0) is False  # no async-TP unit: nothing to check
