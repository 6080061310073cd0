"""The interleaved schedule (virtual stages) on gloo processes: 3 SGD steps equal a single-process run."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError
from autopar.models import GPT, GPTConfig
from autopar.plan.compact import make_plan
from autopar.runtime.checks import check_plan
from autopar.units import unit_tp_info, units
from tests.runtime.cases import MODELS
from tests.runtime.reference import assert_matches_reference

pytestmark = pytest.mark.dist


def _chunks(units: list[str], sizes: list[int], devices: list[list[int]], **strategy) -> list:
    """Chunks of ``sizes`` units in model order, chunk k on ``devices[k % p]``."""
    out, at = [], 0
    for k, n in enumerate(sizes):
        out.append((devices[k % len(devices)], [(u, dict(strategy)) for u in units[at:at + n]]))
        at += n
    return out


def _check(model: str, mbs: int, m: int, sizes: list[int], devices: list[list[int]], pipelines: int = 1,
           **strategy) -> None:
    build, units, (x, y), loss_fn = MODELS[model]
    n = sum(len(d) for d in devices)
    pipes = [(mbs, m, _chunks(units, sizes, [[d + j * n for d in ds] for ds in devices], **strategy))
             for j in range(pipelines)]
    plan = make_plan(pipes, schedule="interleaved", virtual_stages=len(sizes) // len(devices))
    assert_matches_reference(build, plan, x, y, loss_fn=loss_fn)


@pytest.mark.parametrize("model,sizes", [("gpt", [1, 1, 1, 1]), ("mlp", [2, 1, 1, 1])])
@pytest.mark.parametrize("m", [2, 4])
def test_pp2_v2_two_ranks(model, sizes, m):
    _check(model, 8 // m, m, sizes, [[0], [1]])


def test_pp2_v2_uneven_chunks_two_ranks():
    """Chunks of different sizes (the MLP's 5 units as 1 + 2 + 1 + 1), 8 micro-batches of 1."""
    _check("mlp", 1, 8, [1, 2, 1, 1], [[0], [1]])


def test_pp2_v2_dp2():
    """Two devices per stage (dp 2 inside each chunk)."""
    _check("gpt", 4, 2, [1, 1, 1, 1], [[0, 1], [2, 3]])


def test_pp2_v2_two_pipelines():
    """Two data-parallel pipelines, each interleaved: the units' gradients meet across pipelines."""
    _check("gpt", 2, 2, [1, 1, 1, 1], [[0], [1]], pipelines=2)


@pytest.mark.parametrize("strategy", [{"tp": 2}, {"tp": 2, "sp": True}, {"zero": 3}, {"zero": 2}, {"zero": 1}])
def test_pp2_v2_with_tp_or_zero(strategy):
    _check("gpt", 4, 2, [1, 1, 1, 1], [[0, 1], [2, 3]], **strategy)


def _gpt6():
    return GPT(GPTConfig(vocab_size=64, seq_len=8, dim=32, n_layers=6, n_heads=4, ffn_hidden=64))


def test_pp4_v2_four_ranks():
    """Four physical stages, eight one-unit chunks (embed, 6 blocks, head), 4 micro-batches: the chunk
    boundary from stage 3 back to stage 0 is crossed every micro-batch."""
    units = ["embed"] + [f"layers.{i}" for i in range(6)] + ["head"]
    x, y = MODELS["gpt"][2]
    plan = make_plan([(2, 4, _chunks(units, [1] * 8, [[0], [1], [2], [3]]))], schedule="interleaved",
                     virtual_stages=2)
    assert_matches_reference(_gpt6, plan, x, y)


@pytest.mark.parametrize("m,virtual,schedule,words", [
    (3, 2, "interleaved", "needs a multiple of the stage count"),
    (2, 2, "1f1b", "virtual_stages 2 with schedule 1f1b"),
    (2, 1, "interleaved", "needs 2 or more chunks per stage")])
def test_wrap_refuses_what_the_interleaved_table_cannot_run_before_any_collective(m, virtual, schedule, words):
    """wrap's check (the plan rules, on the model's own units): one line naming the pair, no process group."""
    build, names, _, _ = MODELS["gpt"]
    sizes = [1, 1, 1, 1] if virtual == 2 else [2, 2]
    plan = make_plan([(2, m, _chunks(names, sizes, [[0], [1]]))], schedule=schedule, virtual_stages=virtual)
    model = build()
    named = units(model)
    with pytest.raises(AutoparError, match=words):
        check_plan(plan, [n for n, _ in named], {n: unit_tp_info(model, n, mod) for n, mod in named}, 2)


def _forward_only_rank(rank, world, plan, x, y):
    import torch

    from autopar.runtime import wrap

    pm = wrap(MODELS["gpt"][0](), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    try:
        pm.eval_step(x, y)
    except AutoparError as e:
        return str(e)
    return None


def test_forward_only_calls_on_interleaved_pipelines_are_refused_on_every_rank():
    """eval_step / predict are not built for the interleaved table: one line on every rank, no hang."""
    from autopar.runtime.local_ranks import run_distributed

    _, units, (x, y), _ = MODELS["gpt"]
    plan = make_plan([(4, 2, _chunks(units, [1, 1, 1, 1], [[0], [1]]))], schedule="interleaved", virtual_stages=2)
    out = run_distributed(_forward_only_rank, 2, plan, x, y, timeout_s=30)
    assert out[0] == out[1] and out[0].startswith("eval_step / predict: forward-only calls on an interleaved "
                                                 "pipeline are not supported")
