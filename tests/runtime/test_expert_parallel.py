"""Expert parallel (plan ``ep``) on transformers' Mixtral / Qwen2-MoE / Qwen3-MoE: 4 AdamW steps under a plan equal 4 steps
of the single-process model (losses and every parameter, the experts' whole tensors gathered), on 2 and
4 fork-started gloo ranks; checkpoints of expert-sharded weights reload under another plan exactly."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import GPT_UNITS, token_data

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
STEPS, LR, TOL = 4, 1e-2, 2e-5


def mixtral(experts: int = 4):
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                     num_local_experts=experts, num_experts_per_tok=2, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg)


def qwen2_moe():
    cfg = transformers.Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
                                      shared_expert_intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=16, num_experts=4,
                                      num_experts_per_tok=2, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(cfg)


def qwen3_moe():
    """Qwen3-MoE: Qwen3's per-head Q/K norms and head_dim (16 here, on hidden 32 and 4 heads), no shared expert."""
    cfg = transformers.Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=16, num_experts=4, num_experts_per_tok=2,
                                      attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.Qwen3MoeForCausalLM(cfg)


BUILDERS = {"mixtral": mixtral, "qwen2_moe": qwen2_moe, "qwen3_moe": qwen3_moe}


def _adamw(params):
    return torch.optim.AdamW(params, lr=LR)


def _batches():
    """STEPS different global batches of 8 sequences."""
    return [token_data(batch=8, seq=8) if i == 0 else tuple(t.roll(i, dims=0).roll(i, dims=1) for t in token_data())
            for i in range(STEPS)]


def _reference(model: str, clip: float | None = None) -> tuple[list[float], dict[str, torch.Tensor], list]:
    """Single-process AdamW: losses, final parameters, then (gradient norms, logits of the first batch)."""
    from autopar.models.hf import from_transformers
    from autopar.runtime.stage import cross_entropy

    m = from_transformers(BUILDERS[model]())
    opt = _adamw(m.parameters())
    losses, norms = [], []
    for x, y in _batches():
        loss = cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), clip).item())
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        logits = m(_batches()[0][0])
    return losses, {k: v.detach().clone() for k, v in m.named_parameters()}, [norms, logits]


def _train(rank, world, plan, model, clip=None):
    from autopar.runtime.wrap import wrap

    pm = wrap(BUILDERS[model](), plan, optimizer=_adamw, max_grad_norm=clip)
    losses, norms = [], []
    for x, y in _batches():
        losses.append(pm.step(x, y))
        norms.append(pm.last_grad_norm)
    # forward only: the EP exchange without autograd (interleaved pipelines have no forward-only calls)
    logits = pm.predict(_batches()[0][0]) if plan.schedule != "interleaved" else None
    state = pm.full_state_dict()
    local = {f"{u}.{n}": tuple(p.to_local().shape) for u, m in pm.local_units.items()
             for n, p in m.named_parameters() if "experts" in n}
    return losses, (state if rank == 0 else None), local, [norms, logits]


def _layers(**strategy):
    return [(E, {}), (L0, dict(strategy)), (L1, dict(strategy)), (H, {})]


PLANS = {
    "ep2_dp2": [(8, 1, [([0, 1], _layers(ep=2))])],
    "ep2_dp4": [(4, 2, [([0, 1, 2, 3], _layers(ep=2))])],  # expert-DP groups {0, 2} and {1, 3}
    "ep4_dp4": [(4, 2, [([0, 1, 2, 3], _layers(ep=4))])],
    "ep2_pp2": [(4, 2, [([0, 1], [(E, {}), (L0, {"ep": 2})]), ([2, 3], [(L1, {"ep": 2, "zero": 1}), (H, {})])])],
    "ep2_dp4_zero1": [(8, 1, [([0, 1, 2, 3], _layers(ep=2, zero=1))])],
    "ep2_dp4_zero2_ckpt": [(8, 1, [([0, 1, 2, 3], _layers(ep=2, zero=2, ckpt="full"))])],
    "ep2_dp4_zero3": [(8, 1, [([0, 1, 2, 3], _layers(ep=2, zero=3))])],  # FSDP2 over {0, 2} / {1, 3} for experts
    "ep2_dp2_zero3": [(8, 1, [([0, 1], _layers(ep=2, zero=3))])],  # experts whole on their one holder
    # two pipelines: expert gradients summed over {0, 2} and {1, 3}, ZeRO-1 slices inside each stage
    "ep2_two_pipelines": [(2, 2, [([0, 1], _layers(ep=2, zero=1))]), (4, 1, [([2, 3], _layers(ep=2))])],
    "ep2_zero3_two_pipelines": [(4, 1, [([0, 1, 2, 3], _layers(ep=2, zero=3))]),
                                (4, 1, [([4, 5, 6, 7], _layers(ep=2, zero=3))])],
}
# interleaved 1F1B, 2 physical stages x 2 chunks: the MoE chunks run on {2, 3} and {0, 1}
INTERLEAVED = {"ep2_interleaved": [(2, 4, [([0, 1], [(E, {})]), ([2, 3], [(L0, {"ep": 2})]),
                                           ([0, 1], [(L1, {"ep": 2, "zero": 1})]), ([2, 3], [(H, {})])])]}


def _make(name: str):
    if name in INTERLEAVED:
        return make_plan(INTERLEAVED[name], schedule="interleaved", virtual_stages=2)
    if name.endswith("_zb-h1"):  # the zero-bubble schedule: the EP exchange's backward split into B and W
        return make_plan(PLANS[name.removesuffix("_zb-h1")], schedule="zb-h1")
    return make_plan(PLANS[name])


CLIP = 0.5  # below the norms of these steps: clipping acts
CASES = [("ep2_dp2", "mixtral", None), ("ep2_dp4", "mixtral", CLIP), ("ep4_dp4", "mixtral", None),
         ("ep2_pp2", "mixtral", CLIP), ("ep2_pp2_zb-h1", "mixtral", CLIP), ("ep2_dp4_zero1", "mixtral", CLIP), ("ep2_dp4_zero2_ckpt", "mixtral", None),
         ("ep2_dp4_zero3", "mixtral", CLIP), ("ep2_dp2_zero3", "mixtral", CLIP),
         ("ep2_two_pipelines", "mixtral", CLIP), ("ep2_interleaved", "mixtral", None),
         ("ep2_zero3_two_pipelines", "mixtral", CLIP), ("ep2_dp2", "qwen2_moe", None), ("ep2_dp2", "qwen3_moe", None),
         ("ep2_pp2", "qwen3_moe", CLIP)]


@pytest.mark.parametrize("plan_name,model,clip", CASES,
                         ids=[f"{p}-{m}" + ("-clip" if c else "") for p, m, c in CASES])
def test_expert_parallel_equals_single_process(plan_name, model, clip):
    plan = _make(plan_name)
    ep = max(ly.strategy.ep for st in plan.stages for ly in st.layers)
    out = run_distributed(_train, plan.world_size, plan, model, clip, timeout_s=120)
    ref_losses, ref_state, (ref_norms, ref_logits) = _reference(model, clip)
    norms, logits = out[0][3]
    if clip is not None:
        assert min(ref_norms) > clip
        torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), atol=TOL, rtol=TOL)
    if logits is not None:
        torch.testing.assert_close(logits, ref_logits, atol=TOL, rtol=TOL)
    for rank, (losses, _, _, _) in enumerate(out):
        assert losses == out[0][0], f"rank {rank} reports {losses}, rank 0 {out[0][0]}"
    torch.testing.assert_close(torch.tensor(out[0][0]), torch.tensor(ref_losses), atol=TOL, rtol=TOL)
    state = out[0][1]
    assert set(state) == set(ref_state)
    for name, ref in ref_state.items():
        torch.testing.assert_close(state[name], ref, atol=TOL, rtol=TOL, msg=lambda m, n=name: f"{n}: {m}")
    # Each rank keeps only its 4 / ep experts of every MoE unit it holds (ZeRO-3: a 1 / (dp / ep) slice of them).
    fsdp = len(plan.stages[0].devices) // ep if any(ly.strategy.zero == 3 for st in plan.stages for ly in st.layers) else 1
    for _, _, local, _ in out:
        assert local and all(shape[0] == 4 // ep // fsdp for shape in local.values()), local


def _phase(rank, world, plan, path, load):
    from autopar.runtime.wrap import wrap

    pm = wrap(mixtral(), plan, optimizer=_adamw)
    data = _batches()
    if load:
        pm.load(path)
        losses = [pm.step(*data[i]) for i in (2, 3)]
    else:
        losses = [pm.step(*data[i]) for i in (0, 1)]
        pm.save(path)
    state = pm.full_state_dict()
    return losses, (state if rank == 0 else None)


@pytest.mark.parametrize("a,b", [("ep2_dp4_zero1", "ep4_dp4"), ("ep2_dp2", "dense_dp2"), ("ep2_dp4_zero3", "ep2_dp2")])
def test_checkpoint_of_expert_shards_resumes_under_another_plan(a, b, tmp_path):
    """2 steps under plan a, save, load under plan b, 2 more steps == 4 single-process steps."""
    plans = {**PLANS, "dense_dp2": [(8, 1, [([0, 1], _layers(zero=1))])]}
    pa, pb = make_plan(plans[a]), make_plan(plans[b])
    first = run_distributed(_phase, pa.world_size, pa, tmp_path / "ckpt", False, timeout_s=120)
    second = run_distributed(_phase, pb.world_size, pb, tmp_path / "ckpt", True, timeout_s=120)
    ref_losses, ref_state, _ = _reference("mixtral")
    torch.testing.assert_close(torch.tensor(first[0][0] + second[0][0]), torch.tensor(ref_losses), atol=TOL, rtol=TOL)
    for name, ref in ref_state.items():
        torch.testing.assert_close(second[0][1][name], ref, atol=TOL, rtol=TOL, msg=lambda m, n=name: f"{n}: {m}")


def _lopsided(rank, world, routes):
    """One experts module, all copies routed to rank 0's experts: rank 1 computes on zero rows."""
    from torch.distributed.device_mesh import DeviceMesh

    from autopar.runtime.expert_parallel import ExpertParallelExperts

    cfg = transformers.MixtralConfig(hidden_size=8, intermediate_size=6, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    experts = transformers.models.mixtral.modeling_mixtral.MixtralExperts(cfg)
    with torch.no_grad():
        experts.gate_up_proj.normal_()
        experts.down_proj.normal_()
    hidden = torch.randn(6, 8, requires_grad=True)
    index = torch.tensor(routes)
    weights = torch.rand(6, 2, requires_grad=True)
    ref = experts(hidden, index, weights)
    (ref * torch.arange(8.0)).sum().backward()
    share = ExpertParallelExperts(experts, rank, 2, torch.distributed.group.WORLD, DeviceMesh("cpu", [0, 1]))
    mine = slice(rank * 3, rank * 3 + 3)
    h = hidden.detach()[mine].clone().requires_grad_()
    w = weights.detach()[mine].clone().requires_grad_()
    out = share(h, index[mine], w)
    (out * torch.arange(8.0)).sum().backward()
    torch.testing.assert_close(out, ref[mine])
    torch.testing.assert_close(h.grad, hidden.grad[mine])
    torch.testing.assert_close(w.grad, weights.grad[mine])
    experts_here = slice(rank * 2, rank * 2 + 2)
    torch.testing.assert_close(share.gate_up_proj.grad.to_local(), experts.gate_up_proj.grad[experts_here])
    torch.testing.assert_close(share.down_proj.grad.to_local(), experts.down_proj.grad[experts_here])
    return rank


def test_a_rank_whose_experts_receive_no_tokens_still_exchanges_in_backward():
    """Forward and backward of one experts module equal HF's, with every copy sent to rank 0's experts 0 and 1."""
    routes = [[0, 1], [1, 0], [0, 1], [1, 0], [0, 1], [0, 1]]
    assert run_distributed(_lopsided, 2, routes, timeout_s=60) == [0, 1]


def _bf16(rank, world, plan):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from autopar.runtime.wrap import wrap

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, output_dtype=torch.float32)
    pm = wrap(mixtral(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), mixed_precision=policy)
    losses = [pm.step(x, y) for x, y in _batches()[:3]]
    out = pm.predict(_batches()[0][0])
    return losses, pm.full_state_dict(), out


def test_mixed_precision_with_expert_parallel_matches_one_process_under_the_policy():
    """bf16 compute on fp32 masters, ep2 dp4 ZeRO-1: as one process whose parameters are cast to bf16
    (test_api_precision's tolerances: bf16 rounding, not bit for bit)."""
    from torch.func import functional_call

    from autopar.models.hf import from_transformers
    from autopar.runtime.stage import cross_entropy

    plan = make_plan(PLANS["ep2_dp4_zero1"])
    got = run_distributed(_bf16, 4, plan, timeout_s=120)
    m = from_transformers(mixtral())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref_losses = []
    for x, y in _batches()[:3]:
        out = functional_call(m, {k: p.to(torch.bfloat16) for k, p in m.named_parameters()}, (x,)).float()
        loss = cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    losses, state, logits = got[0]
    assert torch.equal(logits, logits.to(torch.bfloat16).float())  # computed in bf16
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=1e-3, rtol=0)
    for k, ref in m.named_parameters():
        torch.testing.assert_close(state[k], ref.detach(), atol=5e-4, rtol=0, msg=lambda msg, n=k: f"{n}: {msg}")


@pytest.mark.parametrize("model", sorted(BUILDERS))
def test_the_units_view_of_each_moe_model_equals_the_hf_model(model):
    from autopar.models.hf import from_transformers

    hf = BUILDERS[model]().eval()
    x = token_data(batch=2, seq=8)[0]
    torch.testing.assert_close(from_transformers(hf)(x), hf(x).logits)
