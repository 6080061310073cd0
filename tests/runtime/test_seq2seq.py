"""wrap of a raw T5 model: the same one-line refusal on every rank, before any collective waits."""

from __future__ import annotations

import pytest
import torch

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import GPT_UNITS, same

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist


def _wrap_t5(rank, world):
    from autopar.runtime import wrap
    from tests.models.test_hf_seq2seq import t5

    plan = make_plan([(4, 2, [([0, 1], same(GPT_UNITS))])])
    try:
        wrap(t5(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    except AutoparError as e:
        return str(e)
    return "wrapped"


def test_t5_is_refused_on_every_rank():
    out = run_distributed(_wrap_t5, 2)
    assert out[0] == out[1]
    assert out[0].startswith("model: transformers model type 't5' (T5ForConditionalGeneration) is an encoder-decoder")
