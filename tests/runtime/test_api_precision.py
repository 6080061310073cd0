"""``wrap(..., mixed_precision=MixedPrecisionPolicy(param_dtype=bf16, output_dtype=fp32))`` against one
process under the same policy: bf16 compute, fp32 master weights, fp32 gradients."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.func import functional_call

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import RankError, run_distributed
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, MODELS, same

pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
BF16 = torch.bfloat16
POLICY = MixedPrecisionPolicy(param_dtype=BF16, output_dtype=torch.float32)
PLANS = {
    "dp2": ("mlp", [(4, 2, [([0, 1], same(MLP_UNITS))])]),
    "zero1": ("gpt", [(4, 2, [([0, 1], same(GPT_UNITS, zero=1))])]),
    "zero3_fsdp_policy": ("gpt", [(4, 2, [([0, 1], same(GPT_UNITS, zero=3))])]),
    "zero_options": ("gpt", [(4, 2, [([0, 1], [(E, {"zero": 1, "zero_overlap": True}), (L0, {"zero": 3, "reshard": False}),
                                               (L1, {"zero": 2, "zero_overlap": True}), (H, {"zero": 3, "reshard": False})])])]),
    "tp2_sp_loss_parallel": ("llama", [(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])]),
    "pp2_1f1b_ckpt": ("gpt", [(2, 4, [([0], same([E, L0], ckpt="full")), ([1], same([L1, H], ckpt="op"))])]),
    "pp_tp_fsdp_4ranks": ("llama", [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True)),
                                            ([2, 3], [(L1, {"zero": 3}), (H, {"zero": 2})])])]),
}
# bf16 rounds at 2^-8 relative; the ranks split matmuls, sums and micro-batches differently: measured
# |dloss| <= 5.6e-4 and |dparam| <= 1.3e-4 (SGD, lr 0.1, 3 steps). On models this small that is also
# how far fp32 training lands from the bf16 reference, so the numbers alone cannot tell the policy
# ran: the unit output dtypes and the bf16-representable output below do.
LOSS_TOL, PARAM_TOL = 1e-3, 5e-4


def _rank(rank, world, model, plan, policy, compile_arg=False):
    from autopar.runtime import wrap

    build, _, (x, y), loss_fn = MODELS[model]
    torch.manual_seed(0)
    pm = wrap(build(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), loss_fn=loss_fn,
              mixed_precision=policy, compile=compile_arg)
    dtypes = {p.dtype for u in pm.local_units.values() for p in u.parameters()}
    outs: dict[str, set] = {}
    for name, unit in pm.local_units.items():
        unit.register_forward_hook(lambda m, a, out, n=name: outs.setdefault(n, set()).add(out.dtype))
    losses = [pm.step(x, y) for _ in range(3)]
    return losses, pm.full_state_dict(), dtypes, outs, pm.predict(x)


def _reference(model):
    """One process under the policy: every parameter cast to bf16 for the forward, floating inputs cast,
    the output cast to fp32; gradients land on the fp32 parameters."""
    from autopar.runtime.stage import cross_entropy

    build, _, (x, y), loss_fn = MODELS[model]
    loss_fn = loss_fn or cross_entropy
    torch.manual_seed(0)
    m = build()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        xin = x.to(BF16) if x.is_floating_point() else x
        out = functional_call(m, {k: p.to(BF16) for k, p in m.named_parameters()}, (xin,)).float()
        loss = loss_fn(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in m.named_parameters()}


CASES = [(name, False) for name in sorted(PLANS)] + [("zero3_fsdp_policy", {"backend": "aot_eager"})]


@pytest.mark.parametrize("name,compile_arg", CASES, ids=[n + ("_compiled" if c else "") for n, c in CASES])
def test_bf16_compute_fp32_master_matches_one_process_under_the_policy(name, compile_arg):
    model, pipelines = PLANS[name]
    got = run_distributed(_rank, make_plan(pipelines).world_size, model, make_plan(pipelines), POLICY, compile_arg,
                          timeout_s=120)
    ref_losses, ref_state = _reference(model)
    units = MODELS[model][1]
    seen = {}
    for losses, state, dtypes, outs, out in got:
        assert dtypes == {torch.float32}  # the master weights stay fp32
        seen.update(outs)
        # Every unit computes in bf16; the last one's output is cast to fp32, so every value of the
        # model's output is a bf16 number (fp32 compute would give values bf16 cannot represent).
        assert out.dtype == torch.float32 and torch.equal(out, out.to(BF16).float())
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=LOSS_TOL, rtol=0)
        for k, ref in ref_state.items():
            torch.testing.assert_close(state[k], ref, atol=PARAM_TOL, rtol=0, msg=lambda m, n=k: f"{n}: {m}")
    assert seen == {u: {torch.float32 if u == units[-1] else BF16} for u in units}, seen


def test_bf16_reduce_dtype_is_refused():
    _, pipelines = PLANS["dp2"]
    bad = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=BF16)
    with pytest.raises(RankError, match="mixed_precision.reduce_dtype: is torch.bfloat16"):
        run_distributed(_rank, 2, "mlp", make_plan(pipelines), bad)


@pytest.mark.parametrize("policy,model,precision,message", [
    ("bf16", torch.nn.Linear(2, 2), "bf16", "mixed_precision: is a str"),
    (POLICY, torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).to(BF16)), "bf16",
     "mixed_precision: the model's parameters have several dtypes"),
    (MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=BF16), torch.nn.Linear(2, 2), "bf16",
     "mixed_precision.reduce_dtype: is torch.bfloat16"),
    (POLICY, torch.nn.Linear(2, 2), "fp32", "mixed_precision.param_dtype: is torch.bfloat16 but the plan was searched "
     "for fp32"),
], ids=["not_a_policy", "mixed_master_dtypes", "bf16_reduction", "plan_searched_for_fp32"])
def test_policies_the_runtime_cannot_run_are_refused(policy, model, precision, message):
    from autopar.errors import AutoparError
    from autopar.runtime.precision_policy import check_policy

    with pytest.raises(AutoparError, match=message):
        check_policy(policy, model, precision)
    check_policy(POLICY, torch.nn.Linear(2, 2), "bf16")  # the supported case passes
    check_policy(None, model, precision)
