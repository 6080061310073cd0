"""``wrap(..., compile=...)``: torch.compile on each local unit's forward, training unchanged.

CPU tests use the ``aot_eager`` backend (dynamo + AOTAutograd, no code generation): inductor's first
call took 70 s for one small GPT block on this machine's two loaded cores (cold cache)."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import RankError, run_distributed
from tests.runtime.cases import GPT_UNITS, MODELS, same
from tests.runtime.reference import reference_train

pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
PLANS = {
    "tp2_sp": [(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])],
    "pp2_full_and_op_ckpt": [(2, 4, [([0], same([E, L0], ckpt="full")),
                                     ([1], same([L1, H], ckpt="op"))])],
}


def _rank(rank, world, plan, compile_arg):
    import torch._dynamo

    from autopar.runtime import wrap

    build, _, (x, y), _ = MODELS["gpt"]
    torch._dynamo.reset()
    torch.manual_seed(0)
    pm = wrap(build(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), compile=compile_arg)
    losses = [pm.step(x, y) for _ in range(3)]
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return losses, pm.full_state_dict(), graphs


@pytest.mark.parametrize("name", sorted(PLANS))
def test_compiled_units_train_like_one_process(name):
    """Losses and parameters within 1e-5 of eager single-process training; every rank compiled graphs."""
    plan = make_plan(PLANS[name])
    got = run_distributed(_rank, plan.world_size, plan, {"backend": "aot_eager"}, timeout_s=120)
    build, _, (x, y), _ = MODELS["gpt"]
    ref_losses, ref_state = reference_train(build, x, y, 3, 0.1)
    for losses, state, graphs in got:
        assert graphs > 0
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=1e-5, rtol=1e-5)
        for k, ref in ref_state.items():
            torch.testing.assert_close(state[k], ref, atol=1e-5, rtol=1e-5, msg=lambda m, n=k: f"{n}: {m}")


def test_compile_argument_is_checked():
    with pytest.raises(RankError, match="compile: must be True, False or a dict"):
        run_distributed(_rank, 2, make_plan(PLANS["tp2_sp"]), "yes")


def test_tp_units_with_activation_checkpointing_are_refused():
    """torch 2.13's dynamo fails on checkpointed DTensor code: refused on every rank before any collective."""
    plan = make_plan([(4, 2, [([0, 1], [(E, {}), (L0, {"tp": 2, "ckpt": "selective"}), (L1, {}), (H, {})])])])
    with pytest.raises(RankError, match="compile: unit layers.0 has tp 2 with ckpt selective"):
        run_distributed(_rank, 2, plan, {"backend": "aot_eager"})
