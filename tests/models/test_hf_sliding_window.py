"""Sliding-window attention (Mistral, Phi-3; Qwen2 / Qwen3 with use_sliding_window): the units view applies the HF
model's window when the sequence is longer than it, so wrap trains the model transformers defines."""

from __future__ import annotations

import pytest
import torch

from autopar.models.hf_units import causal_mask

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=32)


def mistral(attn, window=3):
    return transformers.MistralForCausalLM(transformers.MistralConfig(**SHAPE, sliding_window=window,
                                                                      attn_implementation=attn))


def qwen2(attn, window=3):  # layer 0 full attention, layer 1 windowed (max_window_layers)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SHAPE, use_sliding_window=window is not None, sliding_window=window or 32, max_window_layers=1,
        attn_implementation=attn))


def qwen3(attn, window=3):
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **SHAPE, head_dim=8, use_sliding_window=window is not None, sliding_window=window or 32, max_window_layers=1,
        attn_implementation=attn))


def phi3(attn, window=3):  # Phi-3's window is a config field, as Mistral's
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(**SHAPE, sliding_window=window, pad_token_id=0,
                                                                attn_implementation=attn))


def mixtral(attn, window=3):
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **SHAPE, num_local_experts=4, num_experts_per_tok=2, sliding_window=window, attn_implementation=attn))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("build", [mistral, qwen2, qwen3, phi3, mixtral])
def test_the_units_view_applies_the_window(build, attn):
    from autopar.models.hf import from_transformers

    torch.manual_seed(0)
    hf = build(attn).eval()
    x = torch.randint(0, 64, (2, 12))  # 12 tokens: four times the window
    windowed = hf(x).logits
    torch.testing.assert_close(from_transformers(hf)(x), windowed)
    # the window matters here: the same weights under full causal attention give other logits
    full = build(attn, window=None).eval()
    full.load_state_dict(hf.state_dict())
    assert not torch.allclose(full(x).logits, windowed, atol=1e-4)


def test_the_window_mask_is_transformers_overlay():
    """Key j is seen from query i when i - window < j <= i."""
    m = causal_mask(torch.zeros(1, 5), window=2)[0, 0]
    seen = (m == 0).int()
    assert seen.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]


@pytest.mark.dist
@pytest.mark.parametrize("sp", [False, True])
def test_a_windowed_model_trains_under_tp_like_one_process(sp):
    """The window mask is built from the unit's whole sequence, also when sequence parallelism splits it inside."""
    from autopar.models.hf import from_transformers
    from autopar.plan.compact import make_plan
    from tests.runtime.cases import GPT_UNITS, same, token_data
    from tests.runtime.reference import assert_matches_reference

    x, y = token_data()  # 8 tokens over a window of 3
    assert_matches_reference(lambda: from_transformers(qwen2("sdpa")),
                             make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=sp))])]), x, y)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_config_with_windows_off_keeps_full_attention(attn):
    """Qwen2-MoE with use_sliding_window false (its sliding_window a placeholder): the HF model attends fully,
    and so does the view, at any length."""
    from autopar.models.hf import from_transformers

    torch.manual_seed(0)
    hf = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        **SHAPE, moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
        use_sliding_window=False, sliding_window=3, attn_implementation=attn)).eval()
    x = torch.randint(0, 64, (2, 12))
    torch.testing.assert_close(from_transformers(hf)(x), hf(x).logits)
