"""The mask a transformers decoder block is given: none where its attention masks causally itself (SDPA's
flash path), the explicit causal mask where it applies only what it is given (eager)."""

from __future__ import annotations

import pytest
import torch

from autopar.models.hf_units import SELF_CAUSAL, block_mask, causal_mask

transformers = pytest.importorskip("transformers")


def llama(attn: str):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                   attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg)


def test_sdpa_blocks_get_no_mask_and_eager_blocks_the_causal_mask():
    x = torch.zeros(2, 8, 32)
    assert "sdpa" in SELF_CAUSAL and "eager" not in SELF_CAUSAL
    assert block_mask(llama("sdpa").model.layers[0].self_attn, x) is None
    torch.testing.assert_close(block_mask(llama("eager").model.layers[0].self_attn, x), causal_mask(x))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_units_forward_sees_the_mask_block_mask_gives(attn):
    """The units' blocks pass exactly block_mask's answer to the HF layer (what reaches the attention function)."""
    from autopar.models.hf import from_transformers

    torch.manual_seed(0)
    hf = llama(attn).eval()
    view = from_transformers(hf)
    seen = []
    layer = view.layers[0].layer
    hook = layer.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("attention_mask")), with_kwargs=True)
    x = torch.randint(0, 64, (2, 8))
    torch.testing.assert_close(view(x), hf(x).logits)  # the same causal LM either way
    hook.remove()
    assert (seen[0] is None) == (attn == "sdpa")
