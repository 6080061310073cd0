"""ZeRO-3 ``reshard: false`` (FSDP2 reshard_after_forward=False) and ZeRO-1/2 ``zero_overlap`` (the
distributed optimizer's asynchronous reduce-scatter / all-gather): SGD steps under such plans equal a
single process, on one stage, pipelined (1F1B, GPipe, interleaved), with TP, several pipelines and
accumulation; and each option does what it says (FSDP gathers once per micro-batch instead of twice,
ZeRO-1's reduce-scatter is issued from backward)."""

from __future__ import annotations

import pytest

from autopar.plan.compact import make_plan
from tests.runtime.api_reference import assert_script_matches
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, MODELS, same
from tests.runtime.reference import assert_matches_reference

pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
NR = {"zero": 3, "reshard": False}


def _check(model: str, pipelines, schedule: str = "1f1b", virtual_stages: int = 1) -> None:
    build, _, (x, y), loss_fn = MODELS[model]
    plan = make_plan(pipelines, schedule=schedule, virtual_stages=virtual_stages)
    assert_matches_reference(build, plan, x, y, loss_fn=loss_fn)


@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_no_reshard_one_stage(model):
    _check(model, [(4, 2, [([0, 1], same(MODELS[model][1], **NR))])])


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_no_reshard_pipelined_four_ranks(schedule):
    """2 stages x 2 FSDP ranks, 4 micro-batches: forwards of later micro-batches find the parameters still
    gathered, backwards reshard them (a fully recomputed unit reruns its forward on the kept parameters); mixed
    with resharding units on the same stage."""
    _check("gpt", [(2, 4, [([0, 1], [(E, NR), (L0, {"zero": 3})]), ([2, 3], [(L1, {**NR, "ckpt": "full"}), (H, NR)])])],
           schedule)


def test_no_reshard_interleaved_with_tp():
    """Interleaved 1F1B (2 chunks per stage) with FSDP x TP 2-D units that keep their parameters gathered."""
    chunks = [([0, 1], [(E, NR)]), ([2, 3], [(L0, {**NR, "tp": 2})]), ([0, 1], [(L1, {**NR, "tp": 2})]),
              ([2, 3], [(H, NR)])]
    _check("gpt", [(2, 4, chunks)], "interleaved", virtual_stages=2)


@pytest.mark.parametrize("zero", [1, 2])
@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_zero_overlap_one_stage(model, zero):
    _check(model, [(4, 2, [([0, 1], same(MODELS[model][1], zero=zero, zero_overlap=True))])])


def test_zero_overlap_pipelined_four_ranks():
    """2 stages x 2 DP ranks under 1F1B: ZeRO-1 units reduce-scatter after their 4th backward, ZeRO-2 units
    after each; beside a plain ZeRO-1 unit and a no-reshard ZeRO-3 one."""
    ov1, ov2 = {"zero": 1, "zero_overlap": True}, {"zero": 2, "zero_overlap": True}
    _check("gpt", [(2, 4, [([0, 1], [(E, ov1), (L0, {"zero": 1})]), ([2, 3], [(L1, ov2), (H, NR)])])])


def test_zero_overlap_with_tp_and_two_pipelines():
    """Where the sync group is not the shard group (TP 2; a unit in two pipelines) the step-end sync runs:
    the same numbers."""
    ov1 = {"zero": 1, "zero_overlap": True}
    _check("gpt", [(2, 2, [([0, 1], same(GPT_UNITS, tp=2, **ov1))]), (2, 2, [([2, 3], same(GPT_UNITS, **ov1))])])


ACCUMULATE = [(0, True), (1, True), (2, False), (1, True), (0, False)]


@pytest.mark.parametrize("name", ["one_stage", "pipelined"])
def test_accumulated_steps_with_options(name):
    """step(accumulate=True) calls: ZeRO-1 overlap reduce-scatters once per call (linear: the same sum)."""
    ov1, ov2 = {"zero": 1, "zero_overlap": True}, {"zero": 2, "zero_overlap": True}
    if name == "one_stage":
        model, pipes = "mlp", [(4, 2, [([0, 1], [(u, ov1 if i % 2 else ov2) for i, u in enumerate(MLP_UNITS)])])]
    else:
        model, pipes = "gpt", [(2, 4, [([0, 1], [(E, ov1), (L0, NR)]), ([2, 3], [(L1, ov2), (H, ov1)])])]
    assert_script_matches(model, make_plan(pipes), ACCUMULATE)


# -- what the options do -----------------------------------------------------------------------------
def _count_gathers(rank: int, world: int, plan) -> dict[str, int]:
    import torch
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

    import autopar
    from tests.runtime.cases import gpt, token_data

    counts: dict[str, int] = {}
    original = coll.DefaultAllGather.__call__

    def counting(self, output_tensor, input_tensor, group, async_op=False):
        counts["n"] = counts.get("n", 0) + 1
        return original(self, output_tensor, input_tensor, group, async_op)

    coll.DefaultAllGather.__call__ = counting
    try:
        torch.manual_seed(0)
        pm = autopar.wrap(gpt(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
        pm.step(*token_data())
    finally:
        coll.DefaultAllGather.__call__ = original
    return counts


@pytest.mark.parametrize("reshard", [True, False])
def test_no_reshard_gathers_once_per_micro_batch(reshard):
    """One FSDP unit, 4 micro-batches: resharding after forward gathers in each forward and each backward
    (8); reshard: false only in each forward (4: each backward finds them gathered, then reshards)."""
    from autopar.runtime.local_ranks import run_distributed

    strategies = [(E, {}), (L0, {"zero": 3, "reshard": reshard}), (L1, {}), (H, {})]
    plan = make_plan([(2, 4, [([0, 1], strategies)])])
    counts = run_distributed(_count_gathers, 2, plan)
    assert [c["n"] for c in counts] == [8 if reshard else 4] * 2


def _held_after_backward(rank: int, world: int, plan):
    import torch

    import autopar
    from tests.runtime.cases import float_data, mlp, mse

    torch.manual_seed(0)
    pm = autopar.wrap(mlp(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), loss_fn=mse)
    pm.runner.run(*float_data())  # every micro-batch's forward and backward, no step
    out = {}
    for st in pm._states:
        if st.shard is None:
            continue
        full = sum(p.grad is not None for p in st.unit.module.parameters())
        out[st.unit.name] = (full, len(getattr(st.zero2, "pending", [])))
    return out


@pytest.mark.parametrize("overlap", [True, False])
def test_zero1_overlap_reduce_scatters_from_backward(overlap):
    """After the schedule's backwards, before the step: with zero_overlap every ZeRO-1 unit has issued its
    reduce-scatter (one pending, no full gradient held); without, the full gradients wait for the step."""
    from autopar.runtime.local_ranks import run_distributed

    plan = make_plan([(4, 2, [([0, 1], same(MLP_UNITS, zero=1, zero_overlap=overlap))])])
    for held in run_distributed(_held_after_backward, 2, plan):
        assert held, "no ZeRO-1 unit with parameters"
        for unit, (full, pending) in held.items():
            assert (full, pending) == ((0, 1) if overlap else (full, 0)), unit
            if not overlap:
                assert full > 0, unit


def _gathered_after_eval(rank: int, world: int, plan):
    import torch
    from torch.distributed.tensor import DTensor

    import autopar
    from tests.runtime.cases import gpt, token_data

    torch.manual_seed(0)
    pm = autopar.wrap(gpt(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    x, y = token_data()
    losses = [pm.eval_step(x, y)]
    sharded = all(isinstance(p, DTensor) for p in pm.local_units[L0].parameters())
    losses += [pm.step(x, y), pm.eval_step(x, y)]
    return sharded, losses


def test_no_reshard_units_are_resharded_after_forward_only_runs():
    """eval_step runs no backward: the kept parameters are freed after it (sharded DTensors again), and
    training goes on with the same losses as a resharding plan."""
    from autopar.runtime.local_ranks import run_distributed

    kept = run_distributed(_gathered_after_eval, 2, make_plan([(4, 2, [([0, 1], same(GPT_UNITS, **NR))])]))
    plain = run_distributed(_gathered_after_eval, 2, make_plan([(4, 2, [([0, 1], same(GPT_UNITS, zero=3))])]))
    assert [k[0] for k in kept] == [True, True]
    assert [k[1] for k in kept] == [p[1] for p in plain]


def test_tied_embedding_and_head_with_the_options():
    """A tied embedding / head whose copies reduce-scatter from backward (ZeRO-1 and ZeRO-2 overlap) stay
    tied: the ties' sum reads the slices those reduce-scatters filled."""
    from tests.runtime.cases import token_data
    from tests.runtime.test_correctness_ties import tied_gpt

    ov1, ov2 = {"zero": 1, "zero_overlap": True}, {"zero": 2, "zero_overlap": True}
    plan = make_plan([(4, 2, [([0, 1], [(E, ov1), (L0, NR), (L1, {}), (H, ov2)])])])
    assert_matches_reference(tied_gpt, plan, *token_data())
