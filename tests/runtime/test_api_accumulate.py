"""``step(..., accumulate=True)``: gradients of several calls, one optimizer step on their mean,
equal to one process training on the concatenated batch."""

from __future__ import annotations

import pytest

from autopar.plan.compact import make_plan
from tests.runtime.api_reference import adamw, assert_script_matches
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, same

pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
# two optimizer steps: one over batches 0, 1, 2 accumulated, one over batches 1 and 0
SCRIPT = [(0, True), (1, True), (2, False), (1, True), (0, False)]
PLANS = {
    "dp2": ("mlp", [(4, 2, [([0, 1], same(MLP_UNITS))])]),
    "zero2_reduce_scatter_in_backward": ("mlp", [(4, 2, [([0, 1], same(MLP_UNITS, zero=2))])]),
    "zero3": ("gpt", [(4, 2, [([0, 1], same(GPT_UNITS, zero=3))])]),
    "pp2_1f1b": ("gpt", [(2, 4, [([0], same([E, L0])), ([1], same([L1, H]))])]),
    "mixed_4ranks": ("gpt", [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True, zero=1)),
                                     ([2, 3], [(L1, {"zero": 3, "ckpt": "full"}), (H, {"zero": 2})])])]),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_accumulated_steps_match_one_process(name):
    model, pipelines = PLANS[name]
    assert_script_matches(model, make_plan(pipelines), SCRIPT)


def test_accumulation_with_clipping_and_adamw():
    """Clipping sees the accumulated mean gradient; AdamW within 1e-5 (Llama: GPT's attention key bias
    has an exactly-zero true gradient, float noise that Adam would normalise to unit steps)."""
    assert_script_matches("llama", make_plan(PLANS["mixed_4ranks"][1]), SCRIPT, optimizer=adamw, max_grad_norm=0.3)


def _ignored_rank(rank, world, plan, x, y, y_other):
    import torch

    from autopar.errors import AutoparError
    from autopar.runtime import wrap
    from tests.runtime.cases import gpt

    torch.manual_seed(0)
    pm = wrap(gpt(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    pm.step(x, y, accumulate=True)
    pm.step(x, y, accumulate=True)  # as many valid targets as the first: accepted
    try:
        pm.step(x, y_other)
    except AutoparError as e:
        return str(e)
    return None


def test_accumulated_calls_with_other_valid_token_counts_are_refused():
    """Equal-weight means of calls with different valid-token counts are not one process's mean over
    all their tokens: the differing call is refused on every rank, before it runs."""
    from autopar.runtime.local_ranks import run_distributed
    from tests.runtime.cases import token_data

    x, y = token_data()
    y_other = y.clone()
    y_other[0, :3] = -100
    plan = make_plan([(2, 4, [([0], same([E, L0])), ([1], same([L1, H]))])])
    out = run_distributed(_ignored_rank, 2, plan, x, y, y_other, timeout_s=30)
    assert out[0] == out[1] and out[0].startswith("step targets: 61 valid targets, where the 2 accumulated call(s) "
                                                 "before had 64")
