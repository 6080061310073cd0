"""Ranks that disagree (plan files, model structure, wrap arguments) or fail alone before the first
collective: every rank raises one line naming the cause, in seconds rather than the collective
timeout, and the job ends."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.runtime.agreement import rank_list
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, MODELS, gpt, same

pytestmark = pytest.mark.dist
TIMEOUT = 30.0  # the ranks' collective timeout: every test must end far below it


def _wrap_per_rank(rank, world, plans, builds, kwargs):
    from autopar.runtime import wrap

    try:
        pm = wrap(builds[rank % len(builds)](), plans[rank % len(plans)],
                  optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), **kwargs[rank % len(kwargs)])
    except AutoparError as e:
        return str(e)
    return f"accepted on stage {pm.stage}"


def _run(world, plans, builds=(gpt,), kwargs=({},)):
    start = time.monotonic()
    msgs = run_distributed(_wrap_per_rank, world, list(plans), list(builds), list(kwargs), timeout_s=TIMEOUT)
    return msgs, time.monotonic() - start


def test_one_rank_with_another_zero_level_is_named():
    base = make_plan([(4, 1, [([0, 1, 2], same(GPT_UNITS))])])
    other = make_plan([(4, 1, [([0, 1, 2], same(GPT_UNITS[:2]) + [("layers.1", {"zero": 2}), ("head", {})])])])
    msgs, wall = _run(3, [base, other, base])
    assert wall < 5, wall
    assert len(set(msgs)) == 1, msgs
    assert msgs[0] == ("plan.pipelines[0].stages[0].strategies[layers.1].zero: differs between ranks: "
                       "0 on ranks 0, 2; 2 on rank 1; give every rank the same plan file"), msgs[0]


def test_a_different_stage_split_is_named():
    a = make_plan([(2, 2, [([0], same(GPT_UNITS[:2])), ([1], same(GPT_UNITS[2:]))])])
    b = make_plan([(2, 2, [([0], same(GPT_UNITS[:3])), ([1], same(GPT_UNITS[3:]))])])
    msgs, wall = _run(2, [a, b])
    assert wall < 5, wall
    assert len(set(msgs)) == 1, msgs
    assert msgs[0].startswith("plan.pipelines[0].stages[0].units: differs between ranks: "
                              '["embed", "layers.0"] on rank 0; ["embed", "layers.0", "layers.1"] on rank 1'), msgs[0]


def _wider_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 14), nn.Tanh(), nn.Linear(14, 7), nn.GELU(), nn.Linear(7, 3))


def test_a_different_model_structure_is_named():
    build = MODELS["mlp"][0]
    plan = make_plan([(4, 2, [([0, 1], same(MLP_UNITS))])])
    msgs, wall = _run(2, [plan], builds=[build, _wider_mlp])
    assert wall < 5, wall
    assert len(set(msgs)) == 1, msgs
    assert msgs[0] == ('model.unit[0].params.weight: differs between ranks: "(13, 6) torch.float32" on rank 0; '
                       '"(14, 6) torch.float32" on rank 1; build the same model on every rank'), msgs[0]


def test_different_wrap_arguments_are_named():
    plan = make_plan([(4, 1, [([0, 1], same(GPT_UNITS))])])
    msgs, _ = _run(2, [plan], kwargs=[{}, {"seed": 7}])
    assert set(msgs) == {"wrap.seed: differs between ranks: 0 on rank 0; 7 on rank 1; "
                         "pass the same wrap arguments on every rank"}, msgs


def test_a_plan_file_missing_on_one_rank_is_named_on_every_rank(tmp_path):
    from autopar.plan.io import save_plan

    plan = make_plan([(4, 1, [([0, 1], same(GPT_UNITS))])])
    good = save_plan(plan, tmp_path / "plan.yaml")
    msgs, wall = _run(2, [good, tmp_path / "missing.yaml"])
    assert wall < 5, wall
    assert len(set(msgs)) == 1 and msgs[0].startswith("plan: on rank 1: file ") and "does not exist" in msgs[0], msgs


def _one_rank_model_breaks(rank, world):
    from autopar.runtime import wrap

    class Broken(nn.Linear):
        def named_parameters(self, *args, **kwargs):
            raise RuntimeError("model broke on purpose")

    build = MODELS["mlp"][0]
    model = build()
    if rank == 1:
        model[0] = Broken(6, 13)
    try:
        wrap(model, make_plan([(4, 2, [([0, 1], same(MLP_UNITS))])]), loss_fn=MODELS["mlp"][3],
             optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    except AutoparError as e:
        return f"AutoparError: {e}"
    except RuntimeError as e:
        return f"RuntimeError: {e}"


def test_an_unexpected_error_on_one_rank_reaches_the_others():
    start = time.monotonic()
    msgs = run_distributed(_one_rank_model_breaks, 2, timeout_s=TIMEOUT)
    assert time.monotonic() - start < 5
    assert msgs == ["AutoparError: wrap: rank 1 failed before the first collective: RuntimeError: model broke on "
                    "purpose; see the traceback of rank 1", "RuntimeError: model broke on purpose"], msgs


def test_same_plan_and_model_still_run():
    plan = make_plan([(2, 2, [([0], same(GPT_UNITS[:2])), ([1], same(GPT_UNITS[2:], zero=1))])])
    msgs, _ = _run(2, [plan])
    assert msgs == ["accepted on stage 0", "accepted on stage 1"]


def test_rank_list_compresses_runs():
    assert rank_list([3]) == "rank 3"
    assert rank_list([5, 0, 1, 2, 7, 8]) == "ranks 0-2, 5, 7-8"
