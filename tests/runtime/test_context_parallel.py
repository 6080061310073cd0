"""Context parallel (autopar/runtime/context_parallel.py) against single-process training.

Every case trains 4 AdamW steps under a plan with cp > 1 on forked gloo ranks and on one process,
with ignored targets (-100) in the batch, and asserts equal losses on every rank and equal parameters
(1e-5, as the other runtime tests). The sequence (8 tokens) is split into 2 x cp chunks, so each rank
holds two non-adjacent chunks and its queries attend to keys gathered from the other ranks.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.plan.rules import plan_rules
from autopar.runtime.context_parallel import (
    check_cp_model,
    check_cp_settings,
    chunk_positions,
    split_sequence,
)
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.api_reference import adamw
from tests.runtime.cases import GPT_UNITS, MODELS, same, token_data

pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
STEPS, TOL = 4, 1e-5


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = token_data(batch=8, seq=8)
    y[0, :3] = -100  # ignored targets: the loss is the mean over valid tokens, which CP ranks split unevenly
    y[5, 5:] = -100
    return x, y


def _plan(pipelines):
    plan = make_plan(pipelines)
    plan.model.seq_len = 8
    return plan


def _hf_llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                   attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg)


def _build(model: str) -> nn.Module:
    return _hf_llama() if model == "hf-llama" else MODELS[model][0]()


def _train(rank, world, model, plan, x, y, loss_fn=None):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    try:
        pm = wrap(_build(model), plan, optimizer=adamw, loss_fn=loss_fn)
    except AutoparError as e:
        return str(e)
    losses = [pm.step(x, y) for _ in range(STEPS)]
    return losses, pm.full_state_dict()


def _reference(model, x, y):
    from autopar.models.hf import units_view

    torch.manual_seed(0)
    m = units_view(_build(model))  # HF: its units view, the same weights and logits (tests/runtime/test_hf.py)
    losses, _ = _adamw_steps(m, x, y)
    return losses, {k: v.detach().clone() for k, v in m.named_parameters()}


def _adamw_steps(m, x, y, max_norm: float | None = None) -> tuple[list[float], float | None]:
    """STEPS AdamW steps of one process on (x, y): the losses, and the last total gradient norm when clipped."""
    from autopar.runtime.stage import cross_entropy

    opt = adamw(list(m.parameters()))
    losses, norm = [], None
    for _ in range(STEPS):
        loss = cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        if max_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm).item()
        opt.step()
        losses.append(loss.item())
    return losses, norm


def _block(n: int, **s):
    return [(u, dict(s)) for u in GPT_UNITS[:n]], [(u, dict(s)) for u in GPT_UNITS[n:]]


PLANS = {  # name -> (model, pipelines)
    "cp2_gpt": ("gpt", [(4, 2, [([0, 1], same(GPT_UNITS, cp=2))])]),
    "cp2_llama": ("llama", [(4, 2, [([0, 1], same(GPT_UNITS, cp=2))])]),
    "cp2_dp2_llama": ("llama", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, cp=2))])]),
    "cp4_llama": ("llama", [(2, 4, [([0, 1, 2, 3], same(GPT_UNITS, cp=4))])]),
    "cp2_tp2_gpt": ("gpt", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, cp=2, tp=2))])]),
    "cp2_tp2_llama_mixed_tp": ("llama", [(4, 2, [([0, 1, 2, 3], [(E, {"cp": 2}), (L0, {"cp": 2, "tp": 2}),
                                                                   (L1, {"cp": 2, "tp": 2}), (H, {"cp": 2})])])]),
    "cp2_pp2_llama": ("llama", [(2, 4, [([0, 1], _block(2, cp=2)[0]), ([2, 3], _block(2, cp=2)[1])])]),
    "cp2_zero3_selective_gpt": ("gpt", [(4, 2, [([0, 1], same(GPT_UNITS, cp=2, zero=3, ckpt="selective"))])]),
    "cp2_hf_llama": ("hf-llama", [(4, 2, [([0, 1], same(GPT_UNITS, cp=2))])]),
    "cp2_tp2_hf_llama": ("hf-llama", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, cp=2, tp=2))])]),
    "cp2_tp2_zero3_llama": ("llama", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, cp=2, tp=2, zero=3))])]),
    "cp2_dp2_zero2_op_gpt": ("gpt", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, cp=2, zero=2, ckpt="op"))])]),
    "cp2_zero1_full_llama": ("llama", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, cp=2, zero=1, ckpt="full"))])]),
    # with the ZeRO options (distributed-optimizer overlap; FSDP without resharding after forward)
    "cp2_zero1_overlap_llama": ("llama", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, cp=2, zero=1, zero_overlap=True))])]),
    "cp2_zero3_noreshard_gpt": ("gpt", [(4, 2, [([0, 1], same(GPT_UNITS, cp=2, zero=3, reshard=False, ckpt="selective"))])]),
}


@pytest.mark.parametrize("name", sorted(PLANS) + ["cp2_pp2_llama_zb-h1"])
def test_context_parallel_matches_one_process(name):
    """Every plan of PLANS, and cp 2 on the zero-bubble schedule (B and W of split sequences)."""
    base = name.removesuffix("_zb-h1")
    model, pipelines = PLANS[base]
    if model == "hf-llama":
        pytest.importorskip("transformers")
    plan = _plan(pipelines)
    if name != base:
        plan.schedule = "zb-h1"
    x, y = _data()
    got = run_distributed(_train, plan.world_size, model, plan, x, y)
    ref_losses, ref_state = _reference(model, x, y)
    for rank, out in enumerate(got):
        assert not isinstance(out, str), f"rank {rank}: {out}"
        losses, state = out
        assert losses == got[0][0], f"rank {rank} reports {losses}, rank 0 {got[0][0]}"
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=TOL, rtol=TOL)
        assert set(state) == set(ref_state)
        for k, ref in ref_state.items():
            torch.testing.assert_close(state[k], ref, atol=TOL, rtol=TOL, msg=lambda m, k=k: f"{k}: {m}")


def test_user_loss_refused_on_every_rank():
    """A row-mean user loss cannot be split over sequence chunks: every rank raises the same line."""
    plan = _plan(PLANS["cp2_gpt"][1])
    x, y = _data()
    got = run_distributed(_train, 2, "gpt", plan, x, y, lambda out, t: out.float().mean())
    assert got[0] == got[1] and got[0].startswith("loss_fn: context parallel")


def test_compile_refused_with_cp():
    plan = _plan(PLANS["cp2_gpt"][1])
    with pytest.raises(AutoparError, match=r"^compile: context parallel \(pipelines\[0\]\.stages\[0\]\.layers\[0\]"):
        check_cp_settings(plan, token_loss=True, compiled=True)
    check_cp_settings(plan, token_loss=True, compiled=False)
    check_cp_settings(_plan([(4, 2, [([0, 1], same(GPT_UNITS))])]), token_loss=False, compiled=True)  # no cp


def test_model_without_hook_refused():
    plan = _plan([(4, 2, [([0, 1], same([str(i) for i in range(5)], cp=2))])])
    with pytest.raises(AutoparError, match=r"pipelines\[0\]\.stages\[0\]\.layers\[0\]\.cp: context parallel needs"):
        check_cp_model(plan, nn.Sequential(*[nn.Linear(2, 2) for _ in range(5)]))
    check_cp_model(plan, MODELS["llama"][0]())  # has the hook: no error


def test_plan_rules_name_the_field():
    mixed = _plan([(4, 2, [([0, 1], [(E, {"cp": 2}), (L0, {"cp": 1}), (L1, {"cp": 2}), (H, {"cp": 2})])])])
    fields = [f for f, _, _ in plan_rules(mixed)]
    assert fields == ["pipelines[0].stages[0].layers[1].cp"], fields
    sp = _plan([(4, 2, [([0, 1], same(GPT_UNITS, cp=1, tp=2, sp=True)[:1] + same(GPT_UNITS[1:], cp=1))])])
    assert plan_rules(sp) == []
    with_sp = _plan([(4, 1, [([0, 1, 2, 3], same(GPT_UNITS, cp=2, tp=2, sp=True))])])
    assert any("sequence parallel" in p for _, p, _ in plan_rules(with_sp))
    odd = _plan(PLANS["cp2_gpt"][1])
    odd.model.seq_len = 6
    assert any("2 x cp = 4 equal chunks" in p for _, p, _ in plan_rules(odd))
    wide = _plan([(4, 2, [([0, 1, 2], same(GPT_UNITS, cp=2))])])
    assert any("does not divide the stage's 3 devices" in p for _, p, _ in plan_rules(wide))


def test_load_balanced_chunks():
    """Rank r holds chunks r and 2c-1-r; the ranks' positions cover the sequence once."""
    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    x = torch.arange(16).view(1, 16)
    parts = [split_sequence(x, 4, r) for r in range(4)]
    assert sorted(torch.cat(parts, dim=1).flatten().tolist()) == list(range(16))
    with pytest.raises(AutoparError, match="does not split into 2 x cp = 8"):
        chunk_positions(12, 4, 0)



def _train_clipped(rank, world, plan, x, y, evaluate):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(MODELS["llama"][0](), plan, optimizer=adamw, max_grad_norm=0.5)
    losses = [pm.step(x, y) for _ in range(STEPS)]
    return losses, pm.last_grad_norm, pm.eval_step(x, y) if evaluate else None, pm.full_state_dict()


def _interleaved_plan():
    chunks = [([0, 1], [(E, {"cp": 2})]), ([2, 3], [(L0, {"cp": 2})]), ([0, 1], [(L1, {"cp": 2})]),
              ([2, 3], [(H, {"cp": 2})])]
    plan = make_plan([(2, 4, chunks)], schedule="interleaved", virtual_stages=2)
    plan.model.seq_len = 8
    return plan


@pytest.mark.parametrize("name", ["interleaved", "cp2_pp2"])
def test_cp_with_clipping_and_eval_step(name):
    """cp 2 on an interleaved pipeline (2 stages x 2 chunks) and on a 1f1b one: gradient clipping counts
    every shard once; eval_step's forward-only loss (1f1b; interleaved has none): equal to one process."""
    from autopar.runtime.stage import cross_entropy

    plan = _interleaved_plan() if name == "interleaved" else _plan(PLANS["cp2_pp2_llama"][1])
    x, y = _data()
    got = run_distributed(_train_clipped, 4, plan, x, y, name != "interleaved")
    torch.manual_seed(0)
    m = MODELS["llama"][0]()
    losses, norm = _adamw_steps(m, x, y, max_norm=0.5)
    with torch.no_grad():
        final = cross_entropy(m(x), y).item()
    for got_losses, grad_norm, eval_loss, state in got:
        assert got_losses == got[0][0]
        torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(losses), atol=TOL, rtol=TOL)
        assert abs(grad_norm - norm) <= TOL * max(1.0, norm)
        assert eval_loss is None or abs(eval_loss - final) <= TOL * max(1.0, final)
        for k, v in m.named_parameters():
            torch.testing.assert_close(state[k], v.detach(), atol=TOL, rtol=TOL, msg=lambda m, k=k: f"{k}: {m}")


def _core_rank(rank, world):
    import torch.distributed as dist
    import torch.nn.functional as F

    from autopar.runtime import context_parallel as cpm

    torch.manual_seed(0)
    heads, r = 4, 2
    q = torch.randn(1, heads, 8, 4, requires_grad=True)
    k, v = (torch.randn(1, heads // r, 8, 4, requires_grad=True) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), is_causal=True)
    ref.square().sum().backward()
    ref_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    gathered = []
    plain = cpm.gather_sequence
    cpm.gather_sequence = lambda x, g: (gathered.append(tuple(x.shape)), plain(x, g))[1]
    core = cpm.CPAttentionCore(cpm.CPGroup(dist.group.WORLD, world, rank, tuple(range(world))), kv_repeat=r)
    mine = [cpm.split_sequence(t, world, rank, dim=2) for t in (q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1))]
    out = core(*mine)
    out.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for g in grads:  # each rank holds its tokens' gradients; the sum over ranks is the whole one
        dist.all_reduce(g)
    return ((out - cpm.split_sequence(ref, world, rank, dim=2)).abs().max().item(),
            max((a - b).abs().max().item() for a, b in zip(grads, ref_grads)), gathered)


def test_attention_core_gathers_kv_heads_once_and_matches_causal_attention():
    """CPAttentionCore on 2 ranks: output and gradients equal causal SDPA on the whole sequence, and it
    all-gathers K and V at KV-head width (2 heads of 4 query heads), as the cost model counts."""
    for out_diff, grad_diff, gathered in run_distributed(_core_rank, 2):
        assert out_diff < 1e-6 and grad_diff < 1e-6
        assert gathered == [(1, 2, 4, 4), (1, 2, 4, 4)]  # [batch, KV heads, local tokens, head dim]
