"""transformers' GPT-2 and the families built like it as units: ``embed`` (token and learned position embeddings,
dropout), ``layers.i`` (the HF block), ``head`` (final norm, LM head).

* GPT-2: its ``Conv1D`` projections store their weights transposed (``(in, out)``); column- and row-parallel split
  them by columns and rows (autopar.runtime.tp_linear). Its fused ``c_attn`` computes Q, K and V one after another,
  so it is held as three Conv1D parts (autopar.models.hf_fused), each column-parallel; the attention splits their
  output at ``split_size``, which ``local_heads`` makes the rank's width.
* GPT-BigCode (SantaCoder, StarCoder 1): nn.Linear projections. With multi-head attention its ``c_attn`` is laid
  out per head, so a plain column split gives each rank its heads' Q, K and V; with multi-query attention it is held
  as the queries, split by columns, and the one K and V head, whole on every rank (``kv_replicated``: every rank's
  heads read them, so the gradients of their input and weights are summed over TP), as Megatron runs multi-query.
* GPT-Neo (GPT-Neo 125M-2.7B, TinyStories): separate Q, K, V projections in an ``attention`` module inside the
  block's ``attn``, which masks its local-attention layers to their window itself.

Tensor parallel is Megatron's layout (transformers ships no plan for these). The sequence is split on the HF block
inside ``HFBlock``, which makes an eager attention's causal mask from the whole sequence. Context parallel is not
run: the positions are added in the embedding unit.
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.models.hf_fused import split_fused
from autopar.models.hf_llama import HFHead
from autopar.models.hf_units import HFBlock, HFCausalLM
from autopar.models.tp_plans import HEAD_PLAN, MULTI_QUERY_PARTS, MULTI_QUERY_WHOLE


class HFGPT2Embed(nn.Module):
    """Token plus learned position embeddings (positions from the start of the sequence), then dropout."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.drop(self.wte(tokens) + self.wpe(positions))


def _block(attn: str, projections: dict[str, str], local: str = "local_heads") -> dict[str, str]:
    """A block's TP table: its attention module ``attn`` (relative to the block: the block's ``attn`` or a module in
    it) with ``projections`` and the styles ``local`` sizing it to the rank's heads, and the MLP's c_fc / c_proj."""
    return {"block": "sp_unit", "block.ln_1": "sp_norm",
            **({"block.attn": f"sp_region+{local}"} if attn == "attn" else
               {"block.attn": "sp_region", f"block.{attn}": local}),
            **{f"block.{attn}.{fqn}": style for fqn, style in projections.items()},
            "block.ln_2": "sp_norm", "block.mlp": "sp_region", "block.mlp.c_fc": "colwise",
            "block.mlp.c_proj": "rowwise"}


# model_type -> (the block's attention module, its projections' styles, the fused projections held as parts)
GPT2_LIKE = {
    "gpt2": ("attn", {**{f"c_attn.parts.{i}": "colwise" for i in range(3)}, "c_proj": "rowwise"},
             {"attn.c_attn": "thirds"}),
    "gpt_bigcode": ("attn", {"c_attn": "colwise", "c_proj": "rowwise"}, {}),
    "gpt_neo": ("attn.attention", {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise",
                                   "out_proj": "rowwise"}, {}),
}
# GPT-BigCode with multi-query attention: c_attn held as the queries and the one K and V head (MULTI_QUERY_PARTS;
# local_queries sizes the attention to the rank's query heads)
BIGCODE_MULTI_QUERY = ("attn", {"c_attn": MULTI_QUERY_WHOLE,
                                **{f"c_attn.parts.{i}": style for i, style in enumerate(MULTI_QUERY_PARTS)},
                                "c_proj": "rowwise"}, {"attn.c_attn": "query_then_kv"})


def gpt2_like_view(hf_model: nn.Module) -> HFCausalLM:
    """Units view of a ``GPT2_LIKE`` family's causal LM (shares its modules; fused projections split in place)."""
    cfg, base = hf_model.config, hf_model.transformer
    multi_query = cfg.model_type == "gpt_bigcode" and cfg.multi_query
    attn, projections, fused = BIGCODE_MULTI_QUERY if multi_query else GPT2_LIKE[cfg.model_type]
    for block in base.h:
        split_fused(block, fused, cfg)
    block = _block(attn, projections, "local_queries" if multi_query else "local_heads")
    ffn = getattr(cfg, "n_inner", None) or getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size
    plans = {"embed": {"wte": "vocab_embed"}, "block": block, "head": HEAD_PLAN}
    divisors = {"embed": (cfg.vocab_size,), "head": (cfg.vocab_size,), "block": (cfg.num_attention_heads, ffn)}
    return HFCausalLM(HFGPT2Embed(base.wte, base.wpe, base.drop), [HFBlock(b, attn) for b in base.h],
                      HFHead(base.ln_f, hf_model.lm_head), f"hf-{cfg.model_type}", plans, divisors,
                      {"block": (f"block.{attn}",)})
