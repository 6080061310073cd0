"""transformers' OPT (``OPTForCausalLM``, OPT-125M ... 175B) as units: ``embed``, ``layers.i``, ``head``.

What OPT's decoder adds to a GPT-2-shaped model, each kept as the HF model computes it:

* learned positions offset by 2 (``OPTLearnedPositionalEmbedding``), counted from the start of the sequence, as HF
  counts them for an unpadded batch;
* OPT-350M's ``word_embed_proj_dim`` narrower than the model: ``project_in`` after the token embedding (in
  ``embed``), ``project_out`` before the LM head (in ``head``);
* ``do_layer_norm_before`` false (OPT-350M): each sublayer's norm after its residual add, and no final norm.

Tensor parallel, Megatron's layout (transformers ships no OPT plan): Q, K, V and ``fc1`` column-parallel,
``out_proj`` and ``fc2`` row-parallel, the attention sized to the rank's heads (``local_heads``). The layer runs its
MLP on tokens flattened to ``(batch x sequence, hidden)``; under sequence parallelism the rank's tokens are rows
there, which the styles reach as the second-to-last dimension (the sequence's, in a ``[B, S, H]`` activation):
the rank's rows are gathered before ``fc1`` and reduce-scattered after ``fc2``, and its norms normalise its own
rows. A head with ``project_out`` (OPT-350M) keeps it whole on every rank; under sequence parallelism it projects the
rank's own tokens, so its gradient is a part, summed over TP (``sp_grad_sum``). Context parallel is not run (the
positions are added in the embedding unit); ``layerdrop`` (layers skipped at random in training) is refused.
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.models.hf_units import HFBlock, HFCausalLM


class HFOPTEmbed(nn.Module):
    """Token embedding (then ``project_in``, where the model has it) plus the learned position embedding."""

    def __init__(self, tok: nn.Embedding, positions: nn.Embedding, project_in: nn.Module | None) -> None:
        super().__init__()
        self.tok, self.positions, self.project_in = tok, positions, project_in

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.project_in is not None:
            x = self.project_in(x)
        position_ids = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        return x + self.positions(None, position_ids=position_ids)


class HFOPTHead(nn.Module):
    """The decoder's final norm and ``project_out`` (each where the model has it), then the LM head."""

    def __init__(self, norm: nn.Module | None, project_out: nn.Module | None, proj: nn.Linear) -> None:
        super().__init__()
        self.norm, self.project_out, self.proj = norm, project_out, proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return self.proj(x)


# The TP table of an OPT block. Its norms run on the rank's tokens in either layout (after the residual add, or before
# the MLP on the flattened tokens: the second-to-last dimension both times)
BLOCK_PLAN = {"block": "sp_unit", "block.self_attn_layer_norm": "sp_norm_local",
              "block.self_attn": "sp_region_hidden_states+local_heads",
              **{f"block.self_attn.{p}_proj": "colwise" for p in "qkv"}, "block.self_attn.out_proj": "rowwise",
              "block.final_layer_norm": "sp_norm_local", "block.fc1": "sp_region+colwise", "block.fc2": "rowwise"}


def opt_view(hf_model: nn.Module) -> HFCausalLM:
    """Units view of an ``OPTForCausalLM`` (shares its modules)."""
    cfg, decoder = hf_model.config, hf_model.model.decoder
    if getattr(cfg, "layerdrop", 0.0):
        raise AutoparError("model.config.layerdrop", f"is {cfg.layerdrop}: OPT skips each layer at random in "
                           "training, which no parallel run reproduces", "set layerdrop to 0.0")
    embed = HFOPTEmbed(decoder.embed_tokens, decoder.embed_positions, decoder.project_in)
    head = HFOPTHead(decoder.final_layer_norm, decoder.project_out, hf_model.lm_head)
    layers = [HFBlock(layer, "self_attn") for layer in decoder.layers]
    projected = decoder.project_out is not None  # the norm's output then meets a plain linear layer: a local tensor
    norm = {"norm": "sp_norm_local" if projected else "sp_norm"} if head.norm is not None else {}
    head_plan = {"": "sp_unit_in", **norm, **({"project_out": "sp_grad_sum"} if projected else {}), "proj": "logits"}
    plans = {"embed": {"tok": "vocab_embed"}, "block": BLOCK_PLAN, "head": head_plan}
    divisors = {"embed": (cfg.vocab_size,), "head": (cfg.vocab_size,),
                "block": (cfg.num_attention_heads, cfg.ffn_dim)}
    return HFCausalLM(embed, layers, head, "hf-opt", plans, divisors, {"block": ("block.self_attn",)})
