"""transformers' BERT masked LM (``BertForMaskedLM``) as units: ``embed``, ``layers.i``, ``head``.

* ``embed``: word + position + token type 0 embeddings, LayerNorm, dropout, of token ids;
* ``layers.i``: an encoder layer attending to every position (no mask: as the HF model without padding);
* ``head``: the MLM head's transform (dense, activation, LayerNorm), then the decoder to the vocabulary. The unit
  holds the transform and the decoder, not ``cls.predictions`` itself: the decoder's bias *is* that module's
  ``bias`` (one tensor under two names, which the HF model ties), and a unit holding both names would keep the old
  one whole when tensor parallel splits the decoder's. The checkpoint names of each tensor come from the HF model
  (``autopar.models.hf.hf_names``), so both are still written.

Tensor parallel, Megatron's BERT layout (transformers ships no BERT plan): Q, K, V and the intermediate dense
column-parallel, the attention's output dense and the layer's output dense row-parallel, a vocabulary-parallel word
embedding and decoder. BERT normalises after each residual add (post-norm): under sequence parallelism the
self-attention and the intermediate dense gather the rank's tokens, the row-parallel outputs reduce-scatter them,
and the residual adds and LayerNorms run on the rank's tokens. The head's transform then runs on the rank's own tokens
(its gradient summed over TP: ``sp_grad_sum``) before the decoder gathers them.
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.models.hf_units import HFCausalLM


class HFBertEmbed(nn.Module):
    """BERT's embeddings (word + position + token type 0, LayerNorm, dropout) of token ids."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids=tokens)


class HFBidirectionalBlock(nn.Module):
    """An encoder layer attending to every position (no mask: as the HF model without padding)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


class HFBertHead(nn.Module):
    """The MLM head's transform then its decoder (``cls.predictions``' forward, without registering its tied bias
    twice)."""

    def __init__(self, transform: nn.Module, decoder: nn.Linear) -> None:
        super().__init__()
        self.transform, self.decoder = transform, decoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))


BLOCK_PLAN = {"block": "sp_unit", "block.attention.self": "sp_region",
              **{f"block.attention.self.{p}": "colwise" for p in ("query", "key", "value")},
              "block.attention.output.dense": "rowwise", "block.attention.output.LayerNorm": "sp_norm_local",
              "block.intermediate": "sp_region", "block.intermediate.dense": "colwise",
              "block.output.dense": "rowwise", "block.output.LayerNorm": "sp_norm_local"}
HEAD_PLAN = {"": "sp_unit_in", "transform": "sp_grad_sum", "decoder": "logits"}


def bert_view(hf_model: nn.Module) -> HFCausalLM:
    """Units view of a ``BertForMaskedLM`` (shares its modules)."""
    cfg, base, predictions = hf_model.config, hf_model.bert, hf_model.cls.predictions
    layers = [HFBidirectionalBlock(b) for b in base.encoder.layer]
    head = HFBertHead(predictions.transform, predictions.decoder)
    plans = {"embed": {"embeddings.word_embeddings": "vocab_embed"}, "block": BLOCK_PLAN, "head": HEAD_PLAN}
    divisors = {"embed": (cfg.vocab_size,), "head": (cfg.vocab_size,),
                "block": (cfg.num_attention_heads, cfg.intermediate_size)}
    return HFCausalLM(HFBertEmbed(base.embeddings), layers, head, "hf-bert", plans, divisors,
                      {"block": ("block.attention",)})
