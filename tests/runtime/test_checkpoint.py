"""``pm.save`` / ``pm.load``: 2 AdamW steps under plan A, save, load under plan B (other dp / tp / pp /
ZeRO, other world size), 2 more steps == 4 uninterrupted steps on one process."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import RankError, run_distributed
from tests.runtime.api_reference import adamw, batches, reference_script
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, MODELS, same

pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
LL = GPT_UNITS  # Llama: the same unit names
PLANS = {
    "dp2_zero1": [(4, 2, [([0, 1], same(LL, zero=1))])],
    "tp2_sp": [(4, 2, [([0, 1], same(LL, tp=2, sp=True))])],
    "fsdp_x_tp_4ranks": [(4, 2, [([0, 1, 2, 3], same(LL, tp=2, sp=True, zero=3))])],
    "pp2_tp_zero3_4ranks": [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True)),
                                    ([2, 3], [(L1, {"zero": 3}), (H, {"zero": 2})])])],
    "pp2_gpipe": [(2, 4, [([0], same([E, L0])), ([1], same([L1, H]))])],
    "asymmetric_3ranks": [(2, 2, [([0, 1], same(LL, tp=2, zero=0))]), (2, 2, [([2], same(LL))])],
    "zero2_4ranks": [(4, 2, [([0, 1, 2, 3], same(LL, zero=2))])],
}
PAIRS = [("dp2_zero1", "fsdp_x_tp_4ranks"), ("tp2_sp", "pp2_gpipe"), ("pp2_tp_zero3_4ranks", "dp2_zero1"),
         ("asymmetric_3ranks", "zero2_4ranks"), ("zero2_4ranks", "tp2_sp")]


def _phase(rank, world, plan, path, steps, load, optimizer=adamw, model="llama"):
    from autopar.runtime import wrap

    build, _, _, loss_fn = MODELS[model]
    data = batches(model, 4)
    torch.manual_seed(0)
    pm = wrap(build(), plan, optimizer=optimizer, loss_fn=loss_fn)
    torch.manual_seed((2000 if load else 1000) + rank)  # each rank's RNG differs: the checkpoint keeps it
    torch.rand(5)
    rng = None
    if load:
        pm.load(path)
        rng = torch.rand(3)  # continues the saving rank's stream
        pm.save(path.parent / f"{path.name}-resaved")  # what plan B holds right after loading
    losses = [pm.step(*data[i]) for i in steps]
    if not load:
        pm.save(path)
        rng = torch.rand(3)
    counters = (pm._calls, pm.optimizer_steps)
    return losses, pm.full_state_dict(), counters, rng


def _logical(path) -> dict:
    """A checkpoint's logical content (every tensor whole), read on this one process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(path, path.parent / f"{path.name}.pt")
    return torch.load(path.parent / f"{path.name}.pt", weights_only=False)


def sgd_momentum(ps):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)


def _reference_optimizer_state(optimizer, steps: int) -> dict[str, torch.Tensor]:
    """``optim.<fqn>.<key>`` of one process's optimizer after ``steps`` steps (what a checkpoint must hold)."""
    from autopar.runtime.stage import cross_entropy

    build = MODELS["llama"][0]
    data = batches("llama", steps)
    torch.manual_seed(0)
    m = build()
    opt = optimizer(list(m.parameters()))
    for x, y in data:
        opt.zero_grad()
        cross_entropy(m(x), y).backward()
        opt.step()
    names = {id(p): n for n, p in m.named_parameters()}
    return {f"optim.{names[id(p)]}.{key}": v for p, st in opt.state.items() for key, v in st.items()}


CASES = [(a, b, adamw) for a, b in PAIRS] + [("fsdp_x_tp_4ranks", "asymmetric_3ranks", sgd_momentum)]


@pytest.mark.parametrize("a,b,optimizer", CASES, ids=[f"{a}-to-{b}-{o.__name__}" for a, b, o in CASES])
def test_resume_under_another_plan_continues_exactly(a, b, optimizer, tmp_path):
    """The checkpoint holds the optimizer's state as one process would (AdamW's exp_avg, exp_avg_sq and
    step, SGD's momentum_buffer, per FQN, within 1e-5); plan B, right after loading it, saves it back
    bit for bit; losses and parameters after 2 more steps are within 1e-5 of the uninterrupted
    single-process run (4 steps)."""
    plan_a, plan_b = make_plan(PLANS[a]), make_plan(PLANS[b])
    first = run_distributed(_phase, plan_a.world_size, plan_a, tmp_path / "ckpt", [0, 1], False, optimizer)
    second = run_distributed(_phase, plan_b.world_size, plan_b, tmp_path / "ckpt", [2, 3], True, optimizer)
    saved, resaved = _logical(tmp_path / "ckpt"), _logical(tmp_path / "ckpt-resaved")
    state_keys = [k for k in saved if k.startswith(("model.", "optim."))]
    assert {k for k in resaved if k.startswith(("model.", "optim."))} == set(state_keys)
    for k in state_keys:
        assert torch.equal(saved[k], resaved[k]), k
    _, _, ref2 = reference_script("llama", [(0, False), (1, False)], optimizer)
    ref_optim = _reference_optimizer_state(optimizer, 2)
    assert {k for k in state_keys if k.startswith("model.")} == {f"model.{k}" for k in ref2}
    assert {k for k in state_keys if k.startswith("optim.")} == set(ref_optim)
    for k, ref in ref2.items():
        torch.testing.assert_close(saved[f"model.{k}"], ref, atol=1e-5, rtol=1e-5)
    for k, ref in ref_optim.items():
        torch.testing.assert_close(saved[k], ref, atol=1e-5, rtol=1e-5, msg=lambda m, n=k: f"{n}: {m}")
    ref_losses, _, ref_state = reference_script("llama", [(i, False) for i in range(4)], optimizer)
    losses = first[0][0] + second[0][0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=1e-5, rtol=1e-5)
    for rank, (_, state, counters, rng) in enumerate(second):
        assert counters == (4, 4), counters
        for name, ref in ref_state.items():
            torch.testing.assert_close(state[name], ref, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        assert torch.equal(rng, first[rank if rank < len(first) else 0][3])  # rank 0's when absent


def test_optimizer_without_elementwise_state_is_refused(tmp_path):
    """Adafactor's factored row / column statistics cannot be cut like the parameters (tp 2 here)."""
    plan = make_plan(PLANS["tp2_sp"])
    with pytest.raises(RankError, match="optimizer: Adafactor keeps state .* not element-wise"):
        run_distributed(_phase, 2, plan, tmp_path / "c", [0], False, lambda ps: torch.optim.Adafactor(ps))


def test_checkpoint_of_another_optimizer_is_refused(tmp_path):
    plan = make_plan(PLANS["tp2_sp"])
    run_distributed(_phase, 2, plan, tmp_path / "c", [0], False, sgd_momentum)
    with pytest.raises(RankError, match="checkpoint: .* holds SGD state but this model's optimizer is AdamW"):
        run_distributed(_phase, 2, plan, tmp_path / "c", [1], True)


def test_checkpoint_of_another_model_is_refused(tmp_path):
    mlp_plan = make_plan([(4, 2, [([0, 1], same(MLP_UNITS))])])
    run_distributed(_phase, 2, mlp_plan, tmp_path / "c", [0], False, model="mlp")
    with pytest.raises(RankError, match="checkpoint: .* has no parameter embed.tok.weight"):
        run_distributed(_phase, 2, make_plan(PLANS["tp2_sp"]), tmp_path / "c", [1], True)


def _save_mid_accumulation(rank, world, plan, path):
    from autopar.runtime import wrap

    build, _, (x, y), _ = MODELS["llama"]
    pm = wrap(build(), plan, optimizer=adamw)
    pm.step(x, y, accumulate=True)
    pm.save(path)


def test_save_with_accumulated_gradients_is_refused(tmp_path):
    with pytest.raises(RankError, match=r"save: 1 accumulate=True step call\(s\) hold gradients"):
        run_distributed(_save_mid_accumulation, 2, make_plan(PLANS["dp2_zero1"]), tmp_path / "c")


class _Scale(nn.Module):
    """A unit with a persistent buffer and no parameters."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor([value]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def _buffer_rank(rank, world, scale, path, save):
    from autopar.runtime import wrap
    from tests.runtime.cases import float_data, mse

    torch.manual_seed(0)
    plan = make_plan([(4, 2, [([0, 1], [("0", {"zero": 3}), ("1", {}), ("2", {"zero": 1})])])] if save else
                     [(2, 4, [([0], same(["0"])), ([1], same(["1", "2"]))])])
    pm = wrap(nn.Sequential(nn.Linear(6, 5), _Scale(scale), nn.Linear(5, 3)), plan,
              optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), loss_fn=mse)
    if save:
        pm.step(*float_data())
        pm.save(path)
    else:
        pm.load(path)
    return pm(float_data()[0])


def test_buffers_travel_in_checkpoints(tmp_path):
    """A unit's persistent buffer (3.0 when saved, 1.0 in the loading model) comes back with the weights."""
    saved = run_distributed(_buffer_rank, 2, 3.0, tmp_path / "c", True)
    loaded = run_distributed(_buffer_rank, 2, 1.0, tmp_path / "c", False)
    assert torch.equal(saved[0], loaded[0]) and torch.equal(loaded[0], loaded[1])
