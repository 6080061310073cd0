"""Forward-only calls (``eval_step``, ``predict`` / ``pm(x)``) and ``train()`` / ``eval()`` against one process."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, MODELS, same

pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
PLANS = {
    "dp2": ("gpt", [(4, 2, [([0, 1], same(GPT_UNITS))])]),
    "zero3": ("mlp", [(4, 2, [([0, 1], same(MLP_UNITS, zero=3))])]),
    "tp2_sp_loss_parallel": ("gpt", [(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])]),
    "pp2_1f1b": ("gpt", [(2, 4, [([0], same([E, L0])), ([1], same([L1, H]))])]),
    "pp_tp_zero3_4ranks": ("gpt", [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True)),
                                           ([2, 3], [(L1, {"zero": 3}), (H, {"zero": 1})])])]),
    "asymmetric_3ranks": ("mlp", [(2, 3, [([0], same(MLP_UNITS[:2])), ([1], same(MLP_UNITS[2:]))]),
                                  (2, 1, [([2], same(MLP_UNITS, zero=0))])]),
}


def _forward_rank(rank, world, model_name, plan):
    from autopar.runtime import wrap

    build, _, (x, y), loss_fn = MODELS[model_name]
    torch.manual_seed(0)
    pm = wrap(build(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), loss_fn=loss_fn)
    before = pm.eval_step(x, y)
    out0 = pm.predict(x)
    trained = pm.step(x, y)
    after = pm.eval_step(x, y)
    out1 = pm(x)
    odd = pm.predict(torch.cat([x, x[:3]]))  # 1 global batch + 3 rows: two runs, the second padded
    return before, out0, trained, after, out1, odd


def _reference(model_name):
    from autopar.runtime.stage import cross_entropy

    build, _, (x, y), loss_fn = MODELS[model_name]
    loss_fn = loss_fn or cross_entropy
    torch.manual_seed(0)
    model = build()
    with torch.no_grad():
        out0 = model(x)
        before = loss_fn(out0, y).item()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    with torch.no_grad():
        out1 = model(x)
        after = loss_fn(out1, y).item()
    return before, out0, loss.item(), after, out1


@pytest.mark.parametrize("name", sorted(PLANS))
def test_eval_step_and_predict_match_one_process(name):
    """eval_step = the single-process loss (no update: a step after it still matches), predict = model(x)
    on every rank, before and after one training step, also for a batch that is not the plan's size."""
    model_name, pipelines = PLANS[name]
    plan = make_plan(pipelines)
    got = run_distributed(_forward_rank, plan.world_size, model_name, plan)
    ref = _reference(model_name)
    for rank, (before, out0, trained, after, out1, odd) in enumerate(got):
        torch.testing.assert_close(odd, torch.cat([ref[4], ref[4][:3]]), atol=1e-5, rtol=1e-5)
        assert abs(before - ref[0]) < 1e-5, (rank, before, ref[0])
        assert abs(trained - ref[2]) < 1e-5, (rank, trained, ref[2])
        assert abs(after - ref[3]) < 1e-5, (rank, after, ref[3])
        torch.testing.assert_close(out0, ref[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out1, ref[4], atol=1e-5, rtol=1e-5)
        assert before == got[0][0] and torch.equal(out1, got[0][4])  # the same on every rank


def _dropout_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 13), nn.Dropout(0.5), nn.Tanh(), nn.Linear(13, 3))


def _mode_rank(rank, world, plan):
    from autopar.runtime import wrap
    from tests.runtime.cases import float_data, mse

    x, y = float_data()
    torch.manual_seed(0)
    pm = wrap(_dropout_mlp(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), loss_fn=mse)
    flags = [{m.training for u in pm.local_units.values() for m in u.modules()}]
    pm.eval()
    flags.append({m.training for u in pm.local_units.values() for m in u.modules()})
    loss = pm.eval_step(x, y)
    out = pm(x)
    step_loss = pm.step(x, y)  # eval mode: no dropout, so the step is deterministic too
    after = pm.eval_step(x, y)
    pm.train()
    flags.append({m.training for u in pm.local_units.values() for m in u.modules()})
    return flags, loss, out, step_loss, after, pm.training


@pytest.mark.parametrize("pipelines", [
    [(4, 2, [([0, 1], same(["0", "1", "2", "3"], zero=2))])],
    [(2, 4, [([0], same(["0", "1"])), ([1], same(["2", "3"]))])],
], ids=["zero2", "pp2"])
def test_train_eval_switch_every_local_unit(pipelines):
    """eval() turns dropout (p=0.5) off in every unit on every rank: losses and outputs equal the
    single-process model in eval mode; train() turns it back on."""
    from tests.runtime.cases import float_data, mse

    got = run_distributed(_mode_rank, 2, make_plan(pipelines))
    x, y = float_data()
    torch.manual_seed(0)
    model = _dropout_mlp().eval()
    with torch.no_grad():
        ref_out = model(x)
    ref_loss = mse(ref_out, y).item()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mse(model(x), y).backward()
    opt.step()
    with torch.no_grad():
        ref_after = mse(model(x), y).item()
    for flags, loss, out, step_loss, after, training in got:
        assert flags == [{True}, {False}, {True}] and training
        assert abs(loss - ref_loss) < 1e-6 and abs(step_loss - ref_loss) < 1e-6
        assert abs(after - ref_after) < 1e-6
        torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-6)


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


def _tuple_rank(rank, world):
    from autopar.runtime import wrap
    from tests.runtime.cases import float_data

    torch.manual_seed(0)
    plan = make_plan([(4, 2, [([0], same(["0"])), ([1], same(["1"]))])])
    pm = wrap(nn.Sequential(nn.Linear(6, 3), _Pair()), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    pm.predict(float_data()[0])


def test_predict_refuses_a_non_tensor_output_on_every_rank():
    from autopar.runtime.local_ranks import RankError

    with pytest.raises(RankError, match="predict: the model's output is not a single float or integer tensor"):
        run_distributed(_tuple_rank, 2)


def _eval_ignored_rank(rank, world, plan, x, y):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(MODELS["gpt"][0](), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    return pm.eval_step(x, y)


@pytest.mark.parametrize("name", ["dp2", "pp2_1f1b"])
def test_eval_step_is_the_mean_over_valid_tokens(name):
    """eval_step with ignored (-100) targets, called first (no step counted them before): the
    single-process F.cross_entropy mean over the valid tokens of the whole batch."""
    build, _, (x, y), _ = MODELS["gpt"]
    y = y.clone()
    y[0, :5] = -100  # rows with fewer valid tokens weigh less: a row-weighted mean would differ
    y[3, 1:] = -100
    got = run_distributed(_eval_ignored_rank, 2, make_plan(PLANS[name][1]), x, y, timeout_s=30)
    torch.manual_seed(0)
    with torch.no_grad():
        out = build()(x)
    ref = nn.functional.cross_entropy(out.flatten(0, -2), y.flatten(), ignore_index=-100).item()
    assert got[0] == got[1] == pytest.approx(ref, abs=1e-6)
