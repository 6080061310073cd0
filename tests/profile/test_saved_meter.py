"""The profiler's saved-activation meter on an interleaved stage: every chunk's micro-batches and
units are metered (the 4-process fidelity benchmark's searched plan is interleaved; the meter once
knew only a one-stage runner), as on a plain stage."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import GPT_UNITS, gpt, same, token_data

pytestmark = pytest.mark.dist


def _measure(rank, world, plan, x, y):
    from autopar.profile.runs import measure_rank
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(gpt(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    out = measure_rank(pm, x, y, steps=1, warmup=0)
    return out.saved_peak_bytes, out.saved_per_microbatch, sorted(out.saved_per_unit)


def test_interleaved_chunks_are_metered_like_a_plain_stage():
    x, y = token_data()
    interleaved = make_plan([(2, 4, [([0], same(GPT_UNITS[:1])), ([1], same(GPT_UNITS[1:2])),
                                     ([0], same(GPT_UNITS[2:3])), ([1], same(GPT_UNITS[3:]))])],
                            schedule="interleaved", virtual_stages=2)
    plain = make_plan([(2, 4, [([0], same(GPT_UNITS[:2])), ([1], same(GPT_UNITS[2:]))])])
    chunked = run_distributed(_measure, 2, interleaved, x, y, timeout_s=60)
    flat = run_distributed(_measure, 2, plain, x, y, timeout_s=60)
    for peak, per_mb, _ in chunked:
        assert peak > 0 and len(per_mb) == 4 and all(b > 0 for b in per_mb)
    # rank 0 runs embed and layers.1 interleaved; every unit of each rank is metered
    assert chunked[0][2] == ["embed", "layers.1"] and chunked[1][2] == ["head", "layers.0"]
    assert flat[0][2] == ["embed", "layers.0"]
