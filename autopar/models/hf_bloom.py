"""transformers' BLOOM (``BloomForCausalLM``, BLOOM 560M ... 176B) as units: ``embed`` (token embedding and its
layer norm), ``layers.i``, ``head`` (final norm, tied LM head).

BLOOM has no position embedding: each attention adds ALiBi, a per-head slope times the key position, to its scores.
The HF model builds that tensor once for all heads and hands it to every block; here each block's wrapper builds it
for the heads its rank runs (``heads`` from ``first_head``: the whole model, or under TP the rank's range, set by the
``local_head_range`` style), as the HF model's unpadded path does (slopes times ``arange``). The attention adds its
row-parallel output to the residual itself (``dropout_add``), so under sequence parallelism the attention and the MLP
gather their first input and keep the residual, their second, on the rank's tokens (``sp_region_with_residual``).
Its fused ``query_key_value`` is laid out per head, so a plain column split gives each rank its heads' Q, K and V.
Context parallel is not run (the attention computes its scores itself). ``slow_but_exact`` with ``pretraining_tp``
> 1 (Megatron's TP reproduced on one device by slicing the weights) is refused.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.models.hf_llama import HFHead
from autopar.models.hf_units import HFCausalLM, block_mask
from autopar.models.tp_plans import HEAD_PLAN


class HFBloomEmbed(nn.Module):
    """Token embedding, then BLOOM's embedding layer norm."""

    def __init__(self, tok: nn.Embedding, norm: nn.Module) -> None:
        super().__init__()
        self.tok, self.norm = tok, norm

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok(tokens))


class HFBloomBlock(nn.Module):
    """One BLOOM block, given the ALiBi biases of heads ``[first_head, first_head + heads)`` of ``num_heads`` and the
    causal mask, both over the whole sequence."""

    def __init__(self, block: nn.Module, num_heads: int) -> None:
        super().__init__()
        self.block, self.num_heads, self.first_head, self.heads = block, num_heads, 0, num_heads
        self._slopes = sys.modules[type(block).__module__]._get_alibi_slopes  # transformers' own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq = x.shape[:2]
        slopes = self._slopes(self.num_heads, x.device)[self.first_head:self.first_head + self.heads]
        alibi = (slopes[:, None, None] * torch.arange(seq, device=x.device)).repeat(batch, 1, 1).to(x.dtype)
        out = self.block(x, alibi=alibi, attention_mask=block_mask(self.block.self_attention, x))
        return out[0] if isinstance(out, tuple) else out


BLOCK_PLAN = {"": "local_head_range", "block": "sp_unit", "block.input_layernorm": "sp_norm_local",
              "block.self_attention": "sp_region_with_residual+local_heads",
              "block.self_attention.query_key_value": "colwise", "block.self_attention.dense": "rowwise",
              "block.post_attention_layernorm": "sp_norm_local", "block.mlp": "sp_region_with_residual",
              "block.mlp.dense_h_to_4h": "colwise", "block.mlp.dense_4h_to_h": "rowwise"}


def bloom_view(hf_model: nn.Module) -> HFCausalLM:
    """Units view of a ``BloomForCausalLM`` (shares its modules)."""
    cfg, base = hf_model.config, hf_model.transformer
    if cfg.slow_but_exact and cfg.pretraining_tp > 1:
        raise AutoparError("model.config.slow_but_exact", f"is true with pretraining_tp {cfg.pretraining_tp}: BLOOM "
                           "then slices its projections to mimic Megatron's TP on one device, which autopar's runs "
                           "do not reproduce", "set slow_but_exact to false (the default)")
    embed = HFBloomEmbed(base.word_embeddings, base.word_embeddings_layernorm)
    layers = [HFBloomBlock(block, cfg.n_head) for block in base.h]
    plans = {"embed": {"tok": "vocab_embed"}, "block": BLOCK_PLAN, "head": HEAD_PLAN}
    divisors = {"embed": (cfg.vocab_size,), "head": (cfg.vocab_size,), "block": (cfg.n_head, 4 * cfg.hidden_size)}
    return HFCausalLM(embed, layers, HFHead(base.ln_f, hf_model.lm_head), "hf-bloom", plans, divisors,
                      {"block": ("block.self_attention",)})
