"""Tensors two units share stay tied: a module used at two positions of a Sequential and tied
embeddings train exactly like the single-process model (each unit holds a copy; the copies'
gradients are summed every step), on one stage, across pipeline stages and with data parallelism.
What cannot be kept exact is refused before any collective."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import GPT_UNITS, MODELS, float_data, mse, same, token_data
from tests.runtime.reference import assert_matches_reference

pytestmark = pytest.mark.dist
REPEAT_UNITS = [str(i) for i in range(5)]
TIED_UNITS = [str(i) for i in range(4)]
E, L0, L1, H = GPT_UNITS


def repeated() -> nn.Module:
    """The same Linear at positions 0 and 2 (and one Tanh object at 1 and 3)."""
    lin, act = nn.Linear(6, 6), nn.Tanh()
    return nn.Sequential(lin, act, lin, act, nn.Linear(6, 3))


def tied() -> nn.Module:
    """Token embedding and output projection sharing one [vocab, dim] weight."""
    emb, head = nn.Embedding(64, 16), nn.Linear(16, 64, bias=False)
    head.weight = emb.weight
    return nn.Sequential(emb, nn.Linear(16, 16), nn.Tanh(), head)


def _data(build):
    return float_data() if build is repeated else token_data()


def _loss(build):
    return mse if build is repeated else None


PLANS = {
    "one-stage-dp2": lambda u: [(4, 2, [([0, 1], same(u))])],
    "pp2-copies-on-two-stages": lambda u: [(2, 4, [([0], same(u[:2])), ([1], same(u[2:]))])],
    "pp2-dp2-4-ranks": lambda u: [(4, 2, [([0, 1], same(u[:2])), ([2, 3], same(u[2:]))])],
    "asymmetric-pipelines-4-ranks": lambda u: [(2, 3, [([0], same(u[:1])), ([1], same(u[1:]))]),
                                               (2, 1, [([2, 3], same(u))])],
}


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("build", [repeated, tied], ids=["repeated-module", "tied-embedding"])
def test_shared_tensors_train_like_the_single_process_model(build, plan):
    x, y = _data(build)
    units = REPEAT_UNITS if build is repeated else TIED_UNITS
    assert_matches_reference(build, make_plan(PLANS[plan](units)), x, y, loss_fn=_loss(build))


def _adamw_rank(rank, world, plan, x, y, steps):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(tied(), plan, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    losses = [pm.step(x, y) for _ in range(steps)]
    return losses, pm.full_state_dict()


def test_tied_embedding_adamw_across_stages():
    """AdamW keeps the two copies identical to each other and to the single-process tensor."""
    x, y = token_data()
    plan = make_plan([(2, 4, [([0], same(TIED_UNITS[:2])), ([1], same(TIED_UNITS[2:]))])])
    out = run_distributed(_adamw_rank, 2, plan, x, y, 4, timeout_s=30)
    torch.manual_seed(0)
    ref = tied()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    ref_losses = []
    for _ in range(4):
        loss = torch.nn.functional.cross_entropy(ref(x).flatten(0, -2), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    losses, state = out[0]
    assert torch.equal(state["0.weight"], state["3.weight"])  # the copies never drift apart
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=1e-5, rtol=1e-5)
    for name, p in ref.named_parameters(remove_duplicate=False):
        torch.testing.assert_close(state[name], p.detach(), atol=1e-5, rtol=1e-5)


def _refused(rank, world, build, plan, meta=False):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            model = build()
    else:
        model = build()
    try:
        wrap(model, plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    except AutoparError as e:
        return str(e)
    return "accepted"


def tied_gpt() -> nn.Module:
    model = MODELS["gpt"][0]()
    model.head.proj.weight = model.embed.tok.weight
    return model


@pytest.mark.parametrize("plan", [
    [(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])],
    [(4, 2, [([0, 1], [(E, {"zero": 1}), (L0, {}), (L1, {"zero": 3}), (H, {"zero": 2})])])],
    [(4, 2, [([0, 1], [(E, {"tp": 2})] + same([L0, L1, H], zero=3))])],
    [(2, 4, [([0, 1], same([E, L0], zero=3)), ([2, 3], [(L1, {"tp": 2}), (H, {"tp": 2, "sp": True})])])],
    [(2, 3, [([0], same([E], zero=1)), ([1, 2], same([L0, L1, H], zero=3))]), (2, 1, [([3], same(GPT_UNITS))])],
    [(4, 2, [([0, 1, 2, 3], [(E, {"tp": 2, "zero": 3}), (L0, {}), (L1, {"zero": 1}), (H, {"tp": 2, "zero": 3})])])],
], ids=["tp2-sp", "zero-1-2-3", "tp-embed-fsdp-head", "pp2-fsdp-then-tp", "asymmetric", "fsdp-x-tp-2d-mesh"])
def test_tied_copies_sharded_by_tp_and_zero_stay_tied(plan):
    x, y = token_data()
    plan = make_plan(plan)
    assert_matches_reference(tied_gpt, plan, x, y)


def test_tp_with_zero_1_on_a_tied_unit_is_refused_on_every_rank():
    plan = make_plan([(4, 2, [([0, 1, 2, 3], [(E, {"tp": 2, "zero": 1})] + same([L0, L1, H]))])])
    out = run_distributed(_refused, 4, tied_gpt, plan, timeout_s=30)
    assert out == ["pipelines[0].stages[0].layers[0].zero: embed.tok.weight and head.proj.weight are the same tensor "
                   "(tied weights): the runtime syncs tied copies under tp or under ZeRO-1/2, not both, but unit "
                   "embed has tp 2 and zero 1; give units embed, head zero 0 or 3, or tp 1"] * 4, out


@pytest.mark.parametrize("build,plan", [
    (tied, [(4, 2, [([0], same(TIED_UNITS[:2])), ([1], same(TIED_UNITS[2:]))])]),
    (tied_gpt, [(4, 2, [([0, 1], [(E, {"tp": 2})] + same([L0, L1, H], zero=3))])]),
    (tied_gpt, [(2, 4, [([0, 1], same([E, L0], zero=1)), ([2, 3], [(L1, {}), (H, {"tp": 2, "sp": True})])])]),
    (repeated, [(4, 2, [([0], same(REPEAT_UNITS[:2])), ([1], same(REPEAT_UNITS[2:], zero=0))])]),
], ids=["pp2", "tp-embed-fsdp-head", "pp2-zero1-then-tp", "module-used-twice"])
def test_tied_meta_model_materialises_each_copy_with_the_first_units_value(build, plan):
    """Built on the meta device: each rank holding a copy materialises the tensor's first unit's value
    (that unit built alone when another stage holds it), equal to init_weights on one process."""
    x, y = _data(build)
    assert_matches_reference(build, make_plan(plan), x, y, meta=True, loss_fn=mse if build is repeated else None)


def test_init_weights_keeps_ties_tied_with_the_first_units_value():
    from autopar.runtime.materialize import init_weights, materialize_unit

    with torch.device("meta"):
        model = tied()
    init_weights(model, seed=5)
    assert model[3].weight is model[0].weight
    with torch.device("meta"):
        alone = materialize_unit(tied()[0], "0", 5, torch.device("cpu"))
    assert torch.equal(alone.weight, model[0].weight)


def test_a_batchnorm_used_twice_is_refused():
    from autopar.runtime.ties import untie
    from autopar.units import units

    bn = nn.BatchNorm1d(6)
    with pytest.raises(AutoparError, match=r"^model: 0 and 2 are the same BatchNorm1d \(used twice"):
        untie(units(nn.Sequential(bn, nn.Tanh(), bn)))


def test_untie_keeps_unshared_tensors_and_copies_shared_ones():
    from autopar.runtime.ties import untie
    from autopar.units import units

    model = tied()
    named, ties = untie(units(model))
    assert [n for n, _ in named] == TIED_UNITS
    assert named[0][1] is model[0] and named[1][1] is model[1]  # nothing shared: the caller's own modules
    assert named[3][1] is not model[3] and named[3][1].weight is not model[0].weight
    assert torch.equal(named[3][1].weight, model[0].weight)
    assert [[(c.unit, c.index, c.fqn) for c in t.copies] for t in ties] == [[("0", 0, "weight"), ("3", 0, "weight")]]


def _clipped_rank(rank, world, plan, x, y, steps, max_norm):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(tied(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5), max_grad_norm=max_norm)
    norms = []
    for _ in range(steps):
        pm.step(x, y)
        norms.append(pm.last_grad_norm)
    return norms, pm.full_state_dict()


@pytest.mark.parametrize("plan", ["one-stage-dp2", "pp2-copies-on-two-stages"])
def test_clipping_counts_a_tied_tensor_once(plan):
    """max_grad_norm on a tied model: the global norm is clip_grad_norm_'s over the single tensor
    (not over its two copies), and clipped training matches one process within 1e-5."""
    x, y = token_data()
    out = run_distributed(_clipped_rank, 2, make_plan(PLANS[plan](TIED_UNITS)), x, y, 3, 0.05, timeout_s=30)
    torch.manual_seed(0)
    ref = tied()
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    ref_norms = []
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x).flatten(0, -2), y.flatten()).backward()
        ref_norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)))
        opt.step()
    assert all(n > 0.05 for n in ref_norms)  # every step clips
    norms, state = out[0]
    torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), atol=1e-5, rtol=1e-5)
    for name, p in ref.named_parameters(remove_duplicate=False):
        torch.testing.assert_close(state[name], p.detach(), atol=1e-5, rtol=1e-5)
