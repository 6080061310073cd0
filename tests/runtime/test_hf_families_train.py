"""Every Llama-structured transformers family of tests/models/test_hf_families.py trains under wrap as one process
does: with TP and sequence parallelism where its config ships a TP plan autopar translates, else with pipeline
and data parallelism (ZeRO-3), and under context parallel. float64: some families normalise in float32 inside
the model, whose rounding differs with the tensor shapes a parallel run uses; a wrong shard or mask differs by
far more than the 1e-6 asked."""

from __future__ import annotations

import pytest

from autopar.plan.compact import make_plan
from tests.models.test_hf_families import FAMILIES, MOE_FAMILIES, build
from tests.runtime.cases import GPT_UNITS, same, token_data
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
TP_PLANS = {
    "tp2-sp-zero1": [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=1))])],
    "pp2-tp2-ckpt": [(2, 4, [([0, 1], same([E, L0], tp=2)), ([2, 3], same([L1, H], tp=2, ckpt="full"))])],
}
NO_TP_PLANS = {
    "pp2-dp2-zero3": [(4, 2, [([0, 1], same([E, L0], zero=3)), ([2, 3], same([L1, H], zero=3, ckpt="selective"))])],
}
CP_PLAN = [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, cp=2))])]


# With FAMILIES' configs: OLMo's clip_qkv clamps copies of its projections' outputs; StableLM's per-head norm list
# runs the rank's heads' slice (autopar.models.hf_llama). OLMo 2 / 3
# and Cohere's Q/K norms run on head shards; StableLM, Persimmon and Hunyuan, which ship no HF plan, run autopar's;
# Phi-3's and GLM's fused projections run as parts (autopar.models.hf_fused).
TP_FAMILIES = {"apertus", "arcee", "codegen", "cohere", "cohere2", "cwm", "ernie4_5", "exaone4", "falcon",
               "gemma", "gemma2", "gemma3_text", "glm", "glm4", "gpt_neox", "gptj", "granite", "helium",
               "hunyuan_v1_dense", "llama", "mistral", "nemotron", "olmo", "olmo2", "olmo3", "persimmon",
               "phi", "phi3", "seed_oss", "smollm3", "stablelm", "starcoder2", "vaultgemma"}
VARIANTS = {"olmo-without-clip": ("olmo", dict(clip_qkv=None)), "cohere-without-qk-norm": ("cohere", dict(use_qk_norm=False)),
            "stablelm-without-qk-layernorm": ("stablelm", dict(qk_layernorm=False))}


def view(kind: str, **extra):
    from autopar.models.hf import from_transformers

    return lambda: from_transformers(build(kind, **extra).double())


def _has_tp(kind: str, **extra) -> bool:
    from autopar.models.hf import from_transformers

    return from_transformers(build(kind, **extra)).tp_plans["block"] is not None


def test_the_families_running_tp_are_these():
    assert {k for k in FAMILIES if _has_tp(k)} == TP_FAMILIES
    assert all(_has_tp(kind, **extra) for kind, extra in VARIANTS.values())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_without_the_setting_that_turns_tp_off_the_family_trains_with_tp(variant):
    kind, extra = VARIANTS[variant]
    x, y = token_data()
    assert_matches_reference(view(kind, **extra), make_plan(TP_PLANS["tp2-sp-zero1"]), x, y, tol=1e-6)


CASES = [(k, p) for k in sorted(FAMILIES) for p in (TP_PLANS if _has_tp(k) else NO_TP_PLANS)]


@pytest.mark.parametrize(("kind", "plan"), CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_family_trains_like_one_process(kind, plan):
    x, y = token_data()
    assert_matches_reference(view(kind), make_plan({**TP_PLANS, **NO_TP_PLANS}[plan]), x, y, tol=1e-6)


def _cp_plan():
    plan = make_plan(CP_PLAN)
    plan.model.seq_len = 8
    return plan


@pytest.mark.parametrize("kind", sorted(set(FAMILIES) - {"falcon"}))
def test_family_under_context_parallel_trains_like_one_process(kind):
    x, y = token_data()
    assert_matches_reference(view(kind), _cp_plan(), x, y, tol=1e-6)


@pytest.mark.parametrize("plan", ["tp2-sp-zero1", "pp2-tp2-ckpt", "pp2-dp2-zero3"])
def test_falcon_multi_query_trains_like_one_process(plan):
    """Falcon-7B's layout: its fused QKV held as the queries (column-parallel) and its one K and V head, whole on every
    rank (kv_replicated: their input's and weights' gradients summed over TP), the attention on the rank's queries."""
    from tests.models.test_hf_families import FALCON_VARIANTS

    x, y = token_data()
    assert_matches_reference(view("falcon", **FALCON_VARIANTS["multi-query"]),
                             make_plan({**TP_PLANS, **NO_TP_PLANS}[plan]), x, y, tol=1e-6)


# The MoE families run expert parallel on the routed blocks (gpt-oss's experts transposed, biased, with their own
# clamped gate), and TP with sequence parallelism where autopar translates their attention's plan: the router and
# experts whole on every rank, on its tokens (moe_local). float32: the experts' grouped matmul takes no float64.
DENSE_FIRST = ("glm4_moe", "ernie4_5_moe", "deepseek_v2", "deepseek_v3")
# Multi-head latent attention (DeepSeek) and gpt-oss's per-head attention sinks have no translated TP plan
MOE_TP_FAMILIES = {"ernie4_5_moe", "flex_olmo", "glm4_moe", "granitemoe", "granitemoeshared", "olmoe", "mixtral",
                   "qwen2_moe", "qwen3_moe"}


def _ep_plan(kind: str, **strategy):
    routed = [L1] if kind in DENSE_FIRST else [L0, L1]
    return [(4, 2, [([0, 1, 2, 3], [(u, {**strategy, **({"ep": 2} if u in routed else {})}) for u in GPT_UNITS])])]


MOE_PLANS = {"pp2-dp2-zero3": lambda kind: NO_TP_PLANS["pp2-dp2-zero3"],
             "ep2-zero1": lambda kind: _ep_plan(kind, zero=1),
             "ep2-zero3-ckpt": lambda kind: _ep_plan(kind, zero=3, ckpt="full")}
MOE_TP_PLANS = {
    "tp2-sp-zero1": lambda kind: TP_PLANS["tp2-sp-zero1"],
    "tp2-sp-zero3": lambda kind: [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])],
    "pp2-tp2-sp-ckpt": lambda kind: [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True)),
                                             ([2, 3], same([L1, H], tp=2, sp=True, ckpt="full"))])],
}
MOE_CASES = [(k, p) for k in sorted(MOE_FAMILIES) for p in MOE_PLANS]
MOE_CASES += [(k, p) for k in sorted(MOE_TP_FAMILIES) for p in MOE_TP_PLANS]


def test_the_moe_families_running_tp_are_these():
    assert {k for k in (*MOE_FAMILIES, "mixtral", "qwen2_moe", "qwen3_moe") if _has_tp(k)} == MOE_TP_FAMILIES


@pytest.mark.parametrize(("kind", "plan"), MOE_CASES, ids=[f"{k}-{p}" for k, p in MOE_CASES])
def test_moe_family_trains_like_one_process(kind, plan):
    from autopar.models.hf import from_transformers

    x, y = token_data()
    assert_matches_reference(lambda: from_transformers(build(kind)), make_plan({**MOE_PLANS, **MOE_TP_PLANS}[plan](kind)),
                             x, y)


def test_an_moe_family_with_tp_and_without_sequence_parallel_is_refused_in_one_line():
    """Without sp every TP rank would route every token through whole experts: the work TP is priced as dividing
    would not divide (Megatron-core's MoE layer refuses it too)."""
    from autopar.models.hf import from_transformers
    from tests.runtime.reference import wrap_outcomes

    outcomes = wrap_outcomes(lambda: from_transformers(build("mixtral")), make_plan(TP_PLANS["pp2-tp2-ckpt"]))
    assert outcomes and all("tp 2 without sequence parallel on unit 'layers.0'" in o and "\n" not in o
                            for o in outcomes), outcomes


@pytest.mark.parametrize("kind", sorted(MOE_FAMILIES) + ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_family_under_context_parallel_trains_like_one_process(kind):
    """The routed experts (ep 1) run on each CP rank's own tokens, as every other per-token module does."""
    from autopar.models.hf import from_transformers

    x, y = token_data()
    plan = make_plan(CP_PLAN)
    plan.model.seq_len = 8
    assert_matches_reference(lambda: from_transformers(build(kind)), plan, x, y)


def _meta(kind: str):
    import torch

    from autopar.models.hf import from_transformers

    def build_on_meta():
        with torch.device("meta"):
            return from_transformers(build(kind))
    return build_on_meta


META_PLAN = [(2, 4, [([0], same([E, L0])), ([1], same([L1, H]))])]


@pytest.mark.parametrize("kind", sorted((set(FAMILIES) | set(MOE_FAMILIES)) - {"apertus"}))
def test_family_built_on_the_meta_device_trains_like_one_process(kind):
    """HF's own _init_weights sets every tensor of each unit on the rank that holds it."""
    x, y = token_data()
    assert_matches_reference(_meta(kind), make_plan(META_PLAN), x, y, meta=True)


def test_apertus_on_the_meta_device_is_refused_naming_the_tensor_hf_init_leaves_unset():
    """Its xIELU activation's parameters are set by the constructor, which _init_weights does not redo."""
    from tests.runtime.reference import wrap_outcomes

    outcomes = wrap_outcomes(_meta("apertus"), make_plan(META_PLAN))
    assert any("act_fn.alpha_p (XIELUActivation) is not set" in o and "\n" not in o for o in outcomes), outcomes


def test_codegen_tp_must_divide_the_four_qkv_blocks():
    """Its qkv_proj is 4 blocks of [Q, V, K]: at tp 8 a rank would hold half a block, so the search never offers it
    (a plan asking for it is refused by wrap's TP-limit check)."""
    from autopar.models.hf import from_transformers
    from autopar.modelspec.trace import spec_from_module
    from tests.runtime.cases import token_data

    model = build("codegen", hidden_size=64, num_attention_heads=8, num_key_value_heads=8, n_inner=128)
    block = spec_from_module(from_transformers(model), token_data(batch=1, seq=16)[0], dtype_bytes=2).layers[1]
    assert block.tp_ok(4) and not block.tp_ok(8)  # 8 heads alone would allow tp 8
