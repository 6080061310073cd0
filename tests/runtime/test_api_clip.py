"""``wrap(..., max_grad_norm=)``: the global gradient norm over every shard equals
``torch.nn.utils.clip_grad_norm_`` on one process, and clipping to it gives the same training."""

from __future__ import annotations

import pytest

from autopar.plan.compact import make_plan
from tests.runtime.api_reference import assert_script_matches
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, same

pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
SCRIPT = [(0, False), (1, False), (0, False)]
# Each plan covers several ownership rules of clip.py: DDP copies (chunk 0 counts), ZeRO-1/2 slices
# with TP-replicated parts masked, FSDP x TP shards, copies in another pipeline, a pipeline of TP + sp,
# ZeRO-3 and ZeRO-2 stages.
PLANS = {
    "dp2": ("mlp", [(4, 2, [([0, 1], same(MLP_UNITS))])]),
    "zero2": ("gpt", [(4, 2, [([0, 1], same(GPT_UNITS, zero=2))])]),
    "zero1_x_tp2_4ranks": ("gpt", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, zero=1))])]),
    "fsdp_x_tp_4ranks": ("gpt", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    "asymmetric_tp2_and_tp1": ("gpt", [(2, 2, [([0, 1], same(GPT_UNITS, tp=2))]), (2, 2, [([2], same(GPT_UNITS))])]),
    "pp_tp_zero3_4ranks": ("gpt", [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True)),
                                           ([2, 3], [(L1, {"zero": 3}), (H, {"zero": 2})])])]),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_clipped_training_matches_one_process(name):
    """max_grad_norm 0.3 (below every step's norm, so each step clips): norms within 1e-5 of
    clip_grad_norm_'s, losses and parameters within 1e-5 after 3 SGD steps."""
    model, pipelines = PLANS[name]
    figures = assert_script_matches(model, make_plan(pipelines), SCRIPT, max_grad_norm=0.3)
    assert all(n > 0.3 for n in figures["ref_norms"]), figures  # clipping was active


def test_max_grad_norm_must_be_positive():
    from autopar.runtime.local_ranks import RankError

    with pytest.raises(RankError, match="max_grad_norm: must be positive"):
        assert_script_matches("mlp", make_plan(PLANS["dp2"][1]), SCRIPT, max_grad_norm=0.0)
