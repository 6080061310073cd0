"""Every Llama-structured transformers family wrap runs (autopar.models.hf_llama.LLAMA_LIKE): its units view gives
the HF model's logits, with each config knob that changes the forward set away from its default (embedding
multipliers, logit scales, sliding windows shorter than the sequence, per-head norms, clipping) and every norm and
bias drawn at random, so a step the view left out or applied twice would show."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.cases import HF_TINY, token_data

transformers = pytest.importorskip("transformers")

_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
_WINDOWS = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])
# model_type -> config fields besides HF_TINY (the forward-changing knobs away from their defaults)
FAMILIES = {
    "llama": {},
    "mistral": dict(sliding_window=4),
    "gemma": {},
    "gemma2": dict(_WINDOWS, head_dim=8, query_pre_attn_scalar=8, attn_logit_softcapping=2.0,
                   final_logit_softcapping=1.5),
    "gemma3_text": dict(_WINDOWS, head_dim=8, query_pre_attn_scalar=8, final_logit_softcapping=1.5),
    "olmo": dict(clip_qkv=0.3),
    "olmo2": {},
    "olmo3": dict(_WINDOWS),
    "granite": dict(embedding_multiplier=3.0, logits_scaling=2.5, residual_multiplier=0.7, attention_multiplier=0.3),
    "cohere": dict(logit_scale=0.3, use_qk_norm=True),
    "cohere2": dict(_WINDOWS, logit_scale=0.3),
    "starcoder2": dict(sliding_window=4, use_bias=True),
    "glm": {},  # fused gate_up_proj (autopar.models.hf_fused)
    "glm4": {},
    "phi3": {},  # fused qkv_proj and gate_up_proj
    "smollm3": dict(no_rope_layers=[1, 0]),
    "seed_oss": dict(attention_bias=True, attention_dropout=0.0, residual_dropout=0.0),
    "exaone4": dict(_WINDOWS),
    "apertus": {},
    "arcee": {},
    "ernie4_5": dict(use_bias=True),
    # Pythia: fused per-head QKV, parallel residual, a quarter of each head rotated, biases, embedding dropout
    "gpt_neox": dict(use_parallel_residual=True, rotary_pct=0.25, partial_rotary_factor=0.25),
    "stablelm": dict(use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=True, partial_rotary_factor=0.25),
    "nemotron": dict(partial_rotary_factor=0.5),
    "helium": dict(head_dim=8),
    "vaultgemma": dict(_WINDOWS, head_dim=8, query_pre_attn_scalar=8, final_logit_softcapping=1.5),
    "phi": dict(qk_layernorm=True, partial_rotary_factor=0.5),
    "persimmon": dict(qk_layernorm=True, partial_rotary_factor=0.5),
    "hunyuan_v1_dense": dict(head_dim=8, use_qk_norm=True),
    "cwm": dict(_WINDOWS),
    "gptj": dict(n_inner=64, rotary_dim=4),  # parallel attention and MLP, rotary on part of each head
    "codegen": dict(n_inner=64, rotary_dim=4),
    # Falcon-40B / 180B's layout: KV groups in one fused QKV, two parallel norms, biases
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2, bias=True),
}

_DEEPSEEK = dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                 first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=16, qk_nope_head_dim=8,
                 qk_rope_head_dim=8, v_head_dim=8, n_shared_experts=1)
# The mixture-of-experts families beyond Mixtral and the Qwen MoE models (tests/runtime/test_expert_parallel.py):
# 4 experts, 2 per token; GLM-4.5 and ERNIE 4.5 with a dense first block, as their releases have
MOE_FAMILIES = {
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=3.0, logits_scaling=2.5,
                       residual_multiplier=0.7),
    "glm4_moe": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1,
                     n_group=1, topk_group=1),
    "ernie4_5_moe": dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=16, moe_layer_start_index=1),
    "gpt_oss": dict(_WINDOWS, num_local_experts=4, num_experts_per_tok=2, head_dim=8),
    # multi-head latent attention (V3: with a query down-projection), a shared expert, a dense first block
    "deepseek_v3": dict(_DEEPSEEK, q_lora_rank=16),
    "deepseek_v2": dict(_DEEPSEEK, q_lora_rank=None),
    "granitemoeshared": dict(num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=24,
                             embedding_multiplier=3.0, logits_scaling=2.5, residual_multiplier=0.7),
    "flex_olmo": dict(num_experts=4, num_experts_per_tok=2),
}


def build(kind: str, **extra) -> torch.nn.Module:
    """The family's tiny causal LM, norms, biases and attention sinks drawn away from their initial values."""
    fields = {**FAMILIES.get(kind, {}), **MOE_FAMILIES.get(kind, {}), **extra}
    cfg = transformers.AutoConfig.for_model(kind, **{**HF_TINY, **_IDS, **fields})
    cfg.tie_word_embeddings = False
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or "sinks" in name:
                p.normal_(0.3, 0.5)
    return model


def test_every_family_wrap_runs_is_checked_here():
    from autopar.models.hf_llama import DENSE, MOE

    assert set(DENSE) - {"qwen2", "qwen3"} <= set(FAMILIES)  # those two: tests/runtime/test_hf_qwen.py
    assert set(MOE) - {"mixtral", "qwen2_moe", "qwen3_moe"} <= set(MOE_FAMILIES)


@pytest.mark.parametrize("kind", sorted(FAMILIES) + sorted(MOE_FAMILIES))
def test_the_units_view_gives_the_hf_logits(kind):
    from autopar.models.hf import from_transformers

    torch.manual_seed(0)
    hf = build(kind).eval()
    x = token_data()[0]
    want = hf(x).logits  # before the view holds fused projections as parts (in the HF model itself)
    torch.testing.assert_close(from_transformers(hf)(x), want)


def test_gpt_neox_with_a_sequential_residual_gives_the_hf_logits():
    from autopar.models.hf import from_transformers

    torch.manual_seed(0)
    hf = build("gpt_neox", use_parallel_residual=False).eval()
    x = token_data()[0]
    torch.testing.assert_close(from_transformers(hf)(x), hf(x).logits)


# Falcon-7B's multi-query attention (one K and V head) with attention and MLP in parallel off one norm, and the
# original sequential layout with a K and V per head
FALCON_VARIANTS = {"multi-query": dict(new_decoder_architecture=False, multi_query=True, parallel_attn=True),
                   "sequential": dict(new_decoder_architecture=False, multi_query=False, parallel_attn=False,
                                      num_kv_heads=4)}


@pytest.mark.parametrize("variant", sorted(FALCON_VARIANTS))
def test_falcon_layouts_give_the_hf_logits(variant):
    from autopar.models.hf import from_transformers

    torch.manual_seed(0)
    hf = build("falcon", **FALCON_VARIANTS[variant]).eval()
    x = token_data()[0]
    want = hf(x).logits
    torch.testing.assert_close(from_transformers(hf)(x), want)


def test_falcon_with_alibi_is_refused_in_one_line():
    from autopar.errors import AutoparError
    from autopar.models.hf import from_transformers

    with pytest.raises(AutoparError, match="model.config.alibi.*ALiBi") as err:
        from_transformers(build("falcon", new_decoder_architecture=False, alibi=True))
    assert "\n" not in str(err.value)


def test_a_family_not_checked_is_refused_in_one_line():
    from autopar.errors import AutoparError
    from autopar.models.hf import from_transformers

    cfg = transformers.AutoConfig.for_model("mpt", vocab_size=64, d_model=32, n_layers=2, n_heads=4)
    with pytest.raises(AutoparError, match="mpt.*not supported") as err:
        from_transformers(transformers.AutoModelForCausalLM.from_config(cfg))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", sorted(FAMILIES) + sorted(MOE_FAMILIES))
def test_the_tracer_counts_every_parameter_of_the_family(kind):
    """What `autopar search --model pkg:factory` reads for a factory returning from_transformers(model)."""
    from autopar.models.hf import from_transformers
    from autopar.modelspec.trace import spec_from_module

    model = build(kind)
    spec = spec_from_module(from_transformers(model), token_data(batch=1, seq=16)[0], dtype_bytes=2)
    assert sum(layer.params for layer in spec.layers) == sum(p.numel() for p in model.parameters())
    assert all(layer.flops > 0 for layer in spec.layers[1:])  # the embedding lookup has none
    moe = [layer.moe for layer in spec.layers[1:-1] if layer.moe is not None]
    if kind in MOE_FAMILIES:  # every routed block is found, with its 4 experts and 2 per token
        routed = len(spec.layers) - 2 - (1 if kind in ("glm4_moe", "ernie4_5_moe", "deepseek_v2", "deepseek_v3") else 0)
        assert [(m.num_experts, m.top_k) for m in moe] == [(4, 2)] * routed
    else:
        assert moe == []


def test_a_module_with_joined_styles_is_priced_as_sharded():
    """OLMo's clip_qkv projections are colwise+writable_output: the tracer reads each style, so they count as
    TP-sharded exactly as without clip_qkv."""
    from autopar.models.hf import from_transformers
    from autopar.modelspec.trace import spec_from_module

    def block(**extra):
        model = from_transformers(build("olmo", **extra))
        return spec_from_module(model, token_data(batch=1, seq=16)[0], dtype_bytes=2).layers[1]

    clipped, plain = block(), block(clip_qkv=None)
    assert "writable_output" in from_transformers(build("olmo")).tp_plans["block"]["layer.self_attn.q_proj"]
    assert clipped.tp_params == plain.tp_params > 0 and clipped.tp_collectives == plain.tp_collectives
