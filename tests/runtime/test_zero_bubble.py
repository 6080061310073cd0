"""The zero-bubble schedule (zb-h1: backward split into B and W) on gloo processes: 3 SGD steps equal a
single-process run, and the weight gradients land in W, never in B."""

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


def _stages(units: list[str], sizes: list[int], devices: list[list[int]], **strategy) -> list:
    out, at = [], 0
    for ds, n in zip(devices, sizes):
        out.append((ds, [(u, dict(strategy)) for u in units[at:at + n]]))
        at += n
    return out


def _check(model: str, mbs: int, m: int, sizes: list[int], devices: list[list[int]], pipelines: int = 1,
           **strategy) -> None:
    build, units, (x, y), loss_fn = MODELS[model]
    n = sum(len(d) for d in devices)
    pipes = [(mbs, m, _stages(units, sizes, [[d + j * n for d in ds] for ds in devices], **strategy))
             for j in range(pipelines)]
    assert_matches_reference(build, make_plan(pipes, schedule="zb-h1"), x, y, loss_fn=loss_fn)


@pytest.mark.parametrize("model,sizes", [("gpt", [2, 2]), ("mlp", [3, 2])])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_pp2_two_ranks(model, sizes, m):
    _check(model, 8 // m, m, sizes, [[0], [1]])


def test_pp2_dp2():
    _check("gpt", 4, 2, [2, 2], [[0, 1], [2, 3]])


def test_pp2_two_pipelines():
    """Two data-parallel pipelines: the gradients W accumulates meet across pipelines."""
    _check("gpt", 2, 2, [2, 2], [[0], [1]], pipelines=2)


@pytest.mark.parametrize("strategy", [{"zero": 1}, {"zero": 2}, {"ckpt": "full"}, {"ckpt": "selective"},
                                      {"zero": 2, "ckpt": "full"}, {"tp": 2}, {"tp": 2, "sp": True},
                                      {"tp": 2, "zero": 1}])
def test_pp2_dp2_zero_ckpt_tp(strategy):
    _check("gpt", 4, 2, [2, 2], [[0, 1], [2, 3]], **strategy)


def _gpt6():
    return GPT(GPTConfig(vocab_size=64, seq_len=8, dim=32, n_layers=6, n_heads=4, ffn_hidden=64))


@pytest.mark.parametrize("m", [4, 8])
def test_pp4_four_ranks(m):
    """Four stages (stage 3 defers 3 W's to the drain), micro-batches of 8 // m."""
    units = ["embed"] + [f"layers.{i}" for i in range(6)] + ["head"]
    x, y = MODELS["gpt"][2]
    plan = make_plan([(8 // m, m, _stages(units, [2, 2, 2, 2], [[0], [1], [2], [3]]))], schedule="zb-h1")
    assert_matches_reference(_gpt6, plan, x, y)


def _hook_order_rank(rank, world, plan):
    """On this rank: the events of one step, each gradient landing ("grad") between the start and end of
    the B or W pass that produced it."""
    import torch

    from autopar.runtime import stage, wrap

    events: list[str] = []
    for name in ("backward_input", "backward_weight"):
        real = getattr(stage, name)

        def spy(*args, _real=real, _tag=name[9]):  # "i" (B) or "w" (W)
            events.append(_tag + "(")
            try:
                return _real(*args)
            finally:
                events.append(")")
        setattr(stage, name, spy)
    pm = wrap(MODELS["gpt"][0](), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    for unit in pm.local_units.values():
        for p in unit.parameters():
            p.register_post_accumulate_grad_hook(lambda _p: events.append("grad"))
    pm.step(*MODELS["gpt"][2])
    inside, where = None, []
    for e in events:
        if e.endswith("("):
            inside = e[0]
        elif e == ")":
            inside = None
        else:
            where.append(inside)
    return where, events.count("i("), events.count("w(")


@pytest.mark.parametrize("strategy", [{}, {"zero": 2}])
def test_weight_gradients_land_in_w_never_in_b(strategy):
    """Every parameter gradient accumulates (and so every accumulate-grad hook, ZeRO-2's reduce-scatter
    included, fires) inside a W pass; B passes touch no parameter."""
    from autopar.runtime.local_ranks import run_distributed

    _, units, _, _ = MODELS["gpt"]
    plan = make_plan([(2, 4, _stages(units, [2, 2], [[0, 1], [2, 3]], **strategy))], schedule="zb-h1")
    for where, bs, ws in run_distributed(_hook_order_rank, 4, plan, timeout_s=60):
        assert bs == ws == 4
        assert where and set(where) == {"w"}


@pytest.mark.parametrize("sizes,devices,strategy,words", [
    ([2, 2], [[0, 1], [2, 3]], {"zero": 3}, "schedule zb-h1 with zero 3"),
    ([2, 2], [[0, 1], [2, 3]], {"ckpt": "op"}, "schedule zb-h1 with ckpt op"),
    ([4], [[0, 1, 2, 3]], {}, "schedule zb-h1 on a single-stage pipeline")])
def test_wrap_refuses_what_the_split_backward_cannot_run_before_any_collective(sizes, devices, strategy, words):
    """wrap's check (the plan rules): one line naming the pair, before any process group exists."""
    build, names, _, _ = MODELS["gpt"]
    plan = make_plan([(4, 2, _stages(names, sizes, devices, **strategy))], schedule="zb-h1")
    model = build()
    named = units(model)
    with pytest.raises(AutoparError, match=words):
        check_plan(plan, [n for n, _ in named], {n: unit_tp_info(model, n, mod) for n, mod in named}, 4)


def _peak_held_rank(rank, world, plan):
    """The most micro-batches whose autograd graph (and so its saved activations) this rank holds right
    after a forward: ``StageRunner.outputs`` keeps a micro-batch's output until its backward (1F1B) or
    its W (zb-h1) frees the graph."""
    import torch

    from autopar.runtime import stage, wrap

    peak = [0]
    real = stage.StageRunner.forward

    def forward(self, *args):
        send = real(self, *args)
        peak[0] = max(peak[0], len(self.outputs))
        return send
    stage.StageRunner.forward = forward
    pm = wrap(_gpt6(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    pm.step(*MODELS["gpt"][2])
    return peak[0]


@pytest.mark.parametrize("m", [2, 8])
def test_each_stage_holds_the_micro_batches_the_cost_model_counts(m):
    """4 stages: under zb-h1 every rank holds min(p, m) micro-batches' graphs at its peak (the estimate's
    ``zero_bubble_inflight``), under 1F1B stage s holds min(p - s, m) (``inflight_microbatches``)."""
    from autopar.estimate.zero_bubble import zero_bubble_inflight
    from autopar.runtime.local_ranks import run_distributed
    from cost_models.memory import inflight_microbatches

    units = ["embed"] + [f"layers.{i}" for i in range(6)] + ["head"]
    for schedule in ("zb-h1", "1f1b"):
        plan = make_plan([(8 // m, m, _stages(units, [2, 2, 2, 2], [[0], [1], [2], [3]]))], schedule=schedule)
        held = run_distributed(_peak_held_rank, 4, plan, timeout_s=60)
        want = zero_bubble_inflight(4, m) if schedule == "zb-h1" else [inflight_microbatches("1f1b", 4, s, m)
                                                                        for s in range(4)]
        assert held == want, schedule


def test_compiled_units_run_the_split_backward_like_one_process():
    """wrap(compile=aot_eager): B and W over compiled units' graphs still equal eager single-process training."""
    import torch

    from autopar.runtime.local_ranks import run_distributed
    from tests.runtime.reference import reference_train
    from tests.runtime.test_api_compile import _rank

    build, units, (x, y), _ = MODELS["gpt"]
    plan = make_plan([(2, 4, _stages(units, [2, 2], [[0], [1]]))], schedule="zb-h1")
    got = run_distributed(_rank, 2, plan, {"backend": "aot_eager"}, timeout_s=200)
    ref_losses, ref_state = reference_train(build, x, y, 3, 0.1)
    for losses, state, graphs in got:
        assert graphs > 0
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=1e-5, rtol=1e-5)
        for k, ref in ref_state.items():
            torch.testing.assert_close(state[k], ref, atol=1e-5, rtol=1e-5)


def _backward_flops_rank(rank, world, plan):
    """This rank's FLOPs (torch's FlopCounterMode) in B, in W and, under 1F1B, in whole backwards; and
    whether every B left W a record of its intermediates (W then skips the input-gradient path)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from autopar.runtime import stage, wrap

    flops = {"B": 0, "W": 0, "full": 0}
    records = []

    def counted(fn, key):
        def run(*args):
            with FlopCounterMode(display=False) as fc:
                out = fn(*args)
            flops[key] += fc.get_total_flops()
            if key == "B":
                records.append(type(args[0].output_grads.get(args[1])).__name__)
            return out
        return run
    stage.backward_input = counted(stage.backward_input, "B")
    stage.backward_weight = counted(stage.backward_weight, "W")
    stage.StageRunner.backward = counted(stage.StageRunner.backward, "full")
    pm = wrap(_gpt6(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    pm.step(*MODELS["gpt"][2])
    return flops, set(records)


def test_w_does_not_run_the_input_gradient_path_again():
    """Per rank, B + W count exactly the FLOPs of 1F1B's whole backward (each matmul's input gradient in B,
    its weight gradient in W, none twice); on the later stages B records the intermediates for W and
    carries FLOPs of its own (the first stage, fed token ids, has no B: its W is the whole backward)."""
    from autopar.runtime.local_ranks import run_distributed

    units = ["embed"] + [f"layers.{i}" for i in range(6)] + ["head"]
    got = {}
    for schedule in ("zb-h1", "1f1b"):
        plan = make_plan([(2, 4, _stages(units, [3, 2, 3], [[0], [1], [2]]))], schedule=schedule)
        got[schedule] = run_distributed(_backward_flops_rank, 3, plan, timeout_s=60)
    for s, ((zb, records), (one, _)) in enumerate(zip(got["zb-h1"], got["1f1b"])):
        assert one["full"] > 0 and one["B"] == one["W"] == 0
        assert zb["full"] == 0 and zb["B"] + zb["W"] == one["full"], s
        if s == 0:
            assert zb["B"] == 0 and records == {"Tensor"}  # the output gradient, for W's whole backward
        else:
            assert 0 < zb["B"] < one["full"] and 0 < zb["W"] < one["full"] and records == {"_Groups"}


def test_pipelines_of_different_depths():
    """An asymmetric plan: a 2-stage and a 3-stage zb-h1 pipeline (5 ranks) with different batch shares and
    micro-batch counts; their W-accumulated gradients meet across pipelines as under 1F1B."""
    units = ["embed"] + [f"layers.{i}" for i in range(6)] + ["head"]
    x, y = MODELS["gpt"][2]
    plan = make_plan([(2, 2, _stages(units, [4, 4], [[0], [1]])),
                      (1, 4, _stages(units, [3, 2, 3], [[2], [3], [4]]))], schedule="zb-h1")
    assert_matches_reference(_gpt6, plan, x, y)
