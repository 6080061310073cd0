"""``wrap(..., log_every=N)``: one torchtitan-style line every N optimizer steps, on rank 0 only."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from autopar.runtime.step_log import flops_per_token, peak_flops, tokens_of
from tests.runtime.api_reference import batches
from tests.runtime.cases import GPT_UNITS, MODELS, same

E, L0, L1, H = GPT_UNITS
PLAN = make_plan([(2, 4, [([0], same([E, L0])), ([1], same([L1, H]))])])
LINE = re.compile(r"step: (\d+)  loss: ([\d.]+)  grad_norm: ([\d.]+)  memory: ([\d.]+)GiB\(max_rss\)  "
                  r"tps: ([\d,]+)  tflops: ([\d.]+)(  mfu: ([\d.]+)%)?$")


def _rank(rank, world, log_every):
    from autopar.runtime import wrap

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("autopar.steps").addHandler(handler)
    build = MODELS["gpt"][0]
    data = batches("gpt", 2)
    torch.manual_seed(0)
    pm = wrap(build(), PLAN, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), log_every=log_every,
              max_grad_norm=10.0)
    losses = []
    for i in range(5):
        losses.append(pm.step(*data[i % 2], accumulate=i == 0))  # call 1 accumulates: 4 optimizer steps
    return lines, losses


@pytest.mark.dist
def test_rank_zero_logs_every_n_steps():
    got = run_distributed(_rank, 2, 2)
    lines, losses = got[0]
    assert got[1][0] == [] and len(lines) == 2, got
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert [int(m.group(1)) for m in parsed] == [2, 4]
    assert [float(m.group(2)) for m in parsed] == [round(losses[2], 4), round(losses[4], 4)]
    first = LINE.match(run_distributed(_rank, 2, 1)[0][0][0])  # step 1: the mean over its two calls
    assert first and float(first.group(2)) == round((losses[0] + losses[1]) / 2, 4)
    assert all(float(m.group(4)) > 0 and int(m.group(5).replace(",", "")) > 0 for m in parsed)
    assert run_distributed(_rank, 2, 0)[0][0] == []  # log_every=0: silent
    assert losses[0] != losses[1]


def test_flops_per_token_from_the_plan_or_6n():
    plan = make_plan([(2, 4, [([0], same([E, L0])), ([1], same([L1, H]))])])
    assert flops_per_token(plan, 1000) == (6000.0, "6N")
    plan.predicted = {"tflops": 2.0, "tokens_per_s": 4e6}
    assert flops_per_token(plan, 1000) == (2.0e12 * 2 / 4e6, "plan")
    assert peak_flops(plan) == 2 * plan.cluster.gpu_of(0).flops
    assert tokens_of(torch.zeros(4, 8, dtype=torch.long)) == 32 and tokens_of(torch.zeros(4, 6)) == 4
