"""The random streams units draw from (autopar.runtime.unit_rng): TP replicas draw the same dropout masks where the
residual stream is replicated and their own between column- and row-parallel projections, replicas of the data
draw apart, recomputation redraws the same masks, and the process's own RNG state is left as it was, whatever
each rank's script seeded."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.models.test_hf_families import build
from tests.runtime.cases import GPT_UNITS, same, token_data

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

TP2 = [(4, 2, [([0, 1], same(GPT_UNITS, tp=2))])]
TP2_DP2 = [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2))])]


def _wrapped(kind: str, plan, **dropout):
    from autopar.models.hf import from_transformers
    from autopar.runtime import wrap

    torch.manual_seed(0)
    return wrap(from_transformers(build(kind, **dropout)), plan, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2))


def _unit_outputs(rank, world, plan):
    pm = _wrapped("starcoder2", plan, residual_dropout=0.3, attention_dropout=0.3, embedding_dropout=0.3)
    torch.manual_seed(100 + rank)  # the script seeds each rank apart (data order, ...)
    outs = []
    for name in ("embed", "layers.0", "layers.1"):
        pm.local_units[name].register_forward_hook(lambda m, i, o: outs.append(o.detach().clone()))
    x, y = token_data()
    pm.step(x, y)
    return outs


@pytest.mark.parametrize("sp", [False, True])
def test_tp_replicas_draw_the_same_masks_where_the_residual_stream_is_replicated(sp):
    """Without it each TP rank drops other elements of what must be one replicated tensor. Under sequence
    parallelism too: the embedding unit's output is replicated (only blocks and the head split the sequence)."""
    first, second = run_distributed(_unit_outputs, 2, make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=sp))])]))
    assert len(first) == 6  # 3 units x 2 micro-batches
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def _draws(rank, world, plan):
    pm = _wrapped("qwen3", plan)
    torch.manual_seed(0)  # every rank seeds alike
    inside, outside = [], []
    layer = pm.local_units["layers.0"].layer
    layer.self_attn.q_norm.register_forward_hook(lambda *_: inside.append(torch.rand(4)))  # after q_proj (colwise)
    layer.post_attention_layernorm.register_forward_hook(lambda *_: outside.append(torch.rand(4)))  # after o_proj
    x, y = token_data()
    pm.step(x, y)
    return torch.stack(inside), torch.stack(outside)


def test_tp_ranks_draw_their_own_between_column_and_row_parallel_projections_and_replicas_draw_apart():
    draws = run_distributed(_draws, 4, make_plan(TP2_DP2))  # TP groups {0, 1} and {2, 3}
    (in0, out0), (in1, out1), (in2, out2), _ = draws
    assert torch.equal(out0, out1) and not torch.equal(in0, in1)  # one TP group: shared stream, own heads' stream
    assert not torch.equal(out0, out2) and not torch.equal(in0, in2)  # two DP replicas
    assert not torch.equal(out0[0], out0[1])  # and each micro-batch its own


def test_under_sequence_parallel_each_tp_rank_draws_its_own_in_a_block():
    """A block's residual stream is split along the sequence under sp (inside its wrapper, on the HF layer): each
    TP rank holds its own tokens, so draws outside the column-to-row window come from a stream of its own."""
    (_, out0), (_, out1) = run_distributed(_draws, 2, make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])]))
    assert not torch.equal(out0, out1)


def _trained(rank, world, plan):
    pm = _wrapped("starcoder2", plan, residual_dropout=0.3, attention_dropout=0.3, embedding_dropout=0.3)
    before = torch.get_rng_state()
    x, y = token_data()
    losses = [pm.step(x, y) for _ in range(3)]
    assert torch.equal(torch.get_rng_state(), before), "the process's RNG state moved"
    return losses, pm.full_state_dict()


@pytest.mark.parametrize("ckpt", ["full", "selective", "op"])
def test_recomputation_redraws_the_masks_it_dropped_with(ckpt):
    """Checkpointed units recompute their forward in backward: the same masks, so the same training."""
    plain = run_distributed(_trained, 2, make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])]))[0]
    again = run_distributed(_trained, 2, make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True,
                                                                             ckpt=ckpt))])]))[0]
    assert plain[0] == again[0]
    for k, v in plain[1].items():
        torch.testing.assert_close(again[1][k], v, atol=0, rtol=0, msg=k)


def _resumed(rank, world, plan, path, resume):
    pm = _wrapped("starcoder2", plan, residual_dropout=0.3, attention_dropout=0.3, embedding_dropout=0.3)
    x, y = token_data()
    if resume:
        pm.load(path)
    else:
        for _ in range(2):
            pm.step(x, y)
        pm.save(path)
    return [pm.step(x, y) for _ in range(2)]


def test_training_resumed_from_a_checkpoint_draws_what_it_would_have_drawn(tmp_path):
    plan = make_plan(TP2_DP2)
    straight = run_distributed(_resumed, 4, plan, str(tmp_path / "ckpt"), False)
    resumed = run_distributed(_resumed, 4, plan, str(tmp_path / "ckpt"), True)
    assert straight == resumed
