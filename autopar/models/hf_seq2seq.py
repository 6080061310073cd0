"""transformers' T5 (``T5ForConditionalGeneration``) as a chain of units whose boundaries are tuples.

An encoder-decoder does not fit "each unit takes the previous unit's output": the decoder blocks
read the encoder's output. Here every unit passes the pair ``(encoder states, decoder states)``
(a tuple boundary: the runtime packs it into one tensor between ranks, gradients included):

* ``embed``: input ids ``[B, 2, S]`` (``[:, 0]`` the encoder's input ids, ``[:, 1]`` the decoder's,
  i.e. ``model._shift_right(labels)``; the same length S) -> both embedded by the shared table;
* ``layers.0 .. layers.{E-1}``: the encoder blocks, the decoder states passed through;
* ``layers.E .. layers.{E+D-1}``: the decoder blocks (self-attention, cross-attention to the encoder
  states, feed-forward); the first also applies the encoder's final norm and dropout;
* ``head``: the decoder's final norm and dropout, T5's ``d_model ** -0.5`` output scaling when the
  config asks for it, the LM head -> logits ``[B, S, vocab]``; the targets are the labels (-100
  ignored, as HF's loss).

T5 shares one relative-position bias per stack, owned by its first block. Each block of a stack
here computes that bias itself from the first block's bias table (the one ``nn.Embedding`` is used
by every block of the stack: tied weights, whose copies the runtime keeps summed), so no bias
tensor has to cross units. Neither padding masks (every position attends) nor TP (tp = 1) are
supported. The units equal the HF forward (``tests/models/test_hf_t5.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.models.hf_units import HFCausalLM, causal_mask


class T5Bias(nn.Module):
    """T5's relative position bias ``[1, heads, S, S]`` from one stack's bias table (shared)."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.relative_attention_bias = attention.relative_attention_bias
        self.is_decoder = attention.is_decoder
        self.relative_attention_num_buckets = attention.relative_attention_num_buckets
        self.relative_attention_max_distance = attention.relative_attention_max_distance
        self._relative_position_bucket = attention._relative_position_bucket
        self._compute = type(attention).compute_bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._compute(self, x.shape[1], x.shape[1], device=x.device)


class T5Embed(nn.Module):
    def __init__(self, shared: nn.Embedding, encoder_dropout: nn.Module, decoder_dropout: nn.Module) -> None:
        super().__init__()
        self.shared, self.encoder_dropout, self.decoder_dropout = shared, encoder_dropout, decoder_dropout

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder_dropout(self.shared(ids[:, 0])), self.decoder_dropout(self.shared(ids[:, 1]))


class T5EncoderUnit(nn.Module):
    def __init__(self, block: nn.Module, bias: T5Bias) -> None:
        super().__init__()
        self.block, self.bias = block, bias

    def forward(self, states: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        enc, dec = states
        return self.block(enc, None, self.bias(enc))[0], dec


class T5DecoderUnit(nn.Module):
    def __init__(self, block: nn.Module, bias: T5Bias, encoder_final: nn.Module | None) -> None:
        super().__init__()
        self.block, self.bias, self.encoder_final = block, bias, encoder_final

    def forward(self, states: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        enc, dec = states
        if self.encoder_final is not None:
            enc = self.encoder_final(enc)
        out = self.block(dec, causal_mask(dec), self.bias(dec), enc, None, None)[0]
        return enc, out


class T5Head(nn.Module):
    def __init__(self, final: nn.Module, lm_head: nn.Linear, scale: float) -> None:
        super().__init__()
        self.final, self.lm_head, self.scale = final, lm_head, scale

    def forward(self, states: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.lm_head(self.final(states[1]) * self.scale)


def t5_view(hf_model: nn.Module) -> HFCausalLM:
    """Units view of a ``T5ForConditionalGeneration`` (shares its modules; see the module docstring)."""
    cfg = hf_model.config
    enc, dec = hf_model.encoder, hf_model.decoder
    enc_bias = T5Bias(enc.block[0].layer[0].SelfAttention)
    dec_bias = T5Bias(dec.block[0].layer[0].SelfAttention)
    layers = [T5EncoderUnit(b, enc_bias) for b in enc.block]
    encoder_final = nn.Sequential(enc.final_layer_norm, enc.dropout)
    layers += [T5DecoderUnit(b, dec_bias, encoder_final if i == 0 else None) for i, b in enumerate(dec.block)]
    scale = cfg.d_model ** -0.5 if getattr(cfg, "scale_decoder_outputs", cfg.tie_word_embeddings) else 1.0
    head = T5Head(nn.Sequential(dec.final_layer_norm, dec.dropout), hf_model.lm_head, scale)
    return HFCausalLM(T5Embed(hf_model.shared, enc.dropout, dec.dropout), layers, head, "hf-t5",
                      {"embed": None, "block": None, "head": None}, {}, {"block": ("block.layer.0.SelfAttention",)})
