"""Tensor-parallel plans as data: unit kind -> {submodule FQN relative to the unit: style name}.

In the spirit of HF transformers' ``base_model_tp_plan`` and picotron. The runtime turns a style
name into a torch ``ParallelStyle`` (autopar/runtime/tensor_parallel.py); ``sp_*`` entries only act
when the layer runs with sequence parallelism. Style names:

  colwise       ColwiseParallel: weight rows sharded, output sharded on the last dim (heads / FFN)
  rowwise       RowwiseParallel: weight columns sharded, partial sums all-reduced (reduce-scattered
                along the sequence with sp)
  vocab_embed   RowwiseParallel on an nn.Embedding: vocabulary-parallel embedding
  logits        ColwiseParallel on the LM head: vocabulary-sharded logits, gathered unless the loss
                runs under loss_parallel
  tp_norm       a norm over the features of a column-parallel output (OLMo 2's Q/K norms over all heads,
                Cohere's per-head ones): weight sharded with the heads; where one normalised vector spans
                ranks (a 1-D weight) its statistics are all-reduced, one TP collective per call
  tp_grad_sum   left whole on every rank, but it sees only the rank's heads (Qwen3's Q/K norms): its
                gradient is summed over the TP group by the unit's gradient sync (HF's
                replicated_with_grad_allreduce)
  sp_grad_sum   the same under sequence parallelism only: a replicated module that sees the rank's own tokens
                when the unit splits the sequence and every token otherwise (OPT-350M's project_out)
  moe_local     the same for a sublayer that runs per token and needs sequence parallelism to divide its work (an
                MoE family's router and experts: without sp every rank would run every token's experts); a unit
                holding one runs TP with sp only (MOE_LOCAL, LayerSpec.tp_local_params)
  kv_replicated a projection left whole on every rank whose output each rank's heads read (multi-query
                attention's K and V): the gradients of its input and its parameters are summed over TP
  replicated_input  a module whose parts all read its input (a multi-query QKV held as parts): the input becomes one
                replicated DTensor, so the parts' input gradients are summed before one all-reduce
  local_queries a multi-query attention module (its K and V kv_replicated): the counts that follow its query heads
                only (``num_heads``, ``embed_dim``, ``num_key_value_groups``) become the rank's share
  local_heads   an attention module that sizes its reshapes by head counts it keeps (StableLM's, Persimmon's
                ``self.num_heads``): they become the rank's share of the heads
  head_norm_list  a module keeping one norm per head in its ``norms`` list (StableLM's qk_layernorm): under TP it
                runs the slice of the rank's heads (with tp_grad_sum, each norm's gradient comes from its rank)
  local_head_range  a module keeping the range of heads it computes something for (``first_head``, ``heads``:
                BLOOM's block wrapper building their ALiBi biases): under TP the rank's range
  writable_output  a module whose caller modifies its output in place (Falcon's MLP, OLMo's clamped
                projections): under TP it returns a copy, as a parallel projection's output is a view autograd
                forbids writing to
  sp_norm       SequenceParallel: the norm runs on its sequence shard
  sp_norm_local the same, its output a plain tensor: for a norm whose output is added to the residual stream
                (Gemma 2's norms of the attention and MLP outputs), where sp_norm's DTensor would meet a plain one
  sp_region     the module's input is gathered from sequence shards (attention / MLP need the full sequence)
  sp_region_hidden_states   the same for a module called with ``hidden_states=`` (HF attention)
  sp_region_with_residual   the same for a module called as ``m(x, residual, ...)`` that adds the residual to its
                row-parallel output itself (BLOOM's attention and MLP): ``x`` gathered, the residual left sharded
  sp_unit       the unit's input is split along the sequence and its output gathered back, so unit
                boundaries (what pipeline stages exchange) always hold the full sequence
  sp_unit_in    the unit's input is split along the sequence (its output is not sequence-shaped)

An entry may join several styles with ``+`` (``sp_region_hidden_states+local_heads``): each applies, in order.

TP_DIVISORS names, per unit kind, the config fields a TP degree must divide.
"""

from __future__ import annotations

# The style of a sublayer that runs whole on the rank's tokens and needs sequence parallelism under TP
MOE_LOCAL = "moe_local"
# A multi-query QKV held as its parts (autopar.models.hf_fused's query_then_kv layout): the queries column-parallel,
# the one K and one V head whole on every rank, which all the rank's query heads read
MULTI_QUERY_PARTS = ("colwise", "kv_replicated", "kv_replicated")
# ... and the fused module itself: its input one replicated DTensor for the three parts, so that their input gradients
# are summed before the one all-reduce (three parts converting a plain input each would all-reduce three times)
MULTI_QUERY_WHOLE = "replicated_input"
# The head of a model whose head unit holds ``norm`` then ``proj`` (the LM head): its input split along the sequence,
# the norm on the rank's tokens, the logits vocabulary-parallel
HEAD_PLAN: dict[str, str] = {"": "sp_unit_in", "norm": "sp_norm", "proj": "logits"}

GPT_TP_PLAN: dict[str, dict[str, str]] = {
    "embed": {"tok": "vocab_embed"},
    "block": {
        "": "sp_unit",
        "ln1": "sp_norm",
        "attn": "sp_region",
        "attn.q": "colwise",
        "attn.k": "colwise",
        "attn.v": "colwise",
        "attn.o": "rowwise",
        "ln2": "sp_norm",
        "mlp": "sp_region",
        "mlp.up": "colwise",
        "mlp.down": "rowwise",
    },
    "head": HEAD_PLAN,
}

LLAMA_TP_PLAN: dict[str, dict[str, str]] = {
    "embed": {"tok": "vocab_embed"},
    "block": {
        "": "sp_unit",
        "attn_norm": "sp_norm",
        "attn": "sp_region",
        "attn.q": "colwise",
        "attn.k": "colwise",
        "attn.v": "colwise",
        "attn.o": "rowwise",
        "ffn_norm": "sp_norm",
        "mlp": "sp_region",
        "mlp.gate": "colwise",
        "mlp.up": "colwise",
        "mlp.down": "rowwise",
    },
    "head": HEAD_PLAN,
}

GPT_TP_DIVISORS: dict[str, tuple[str, ...]] = {
    "embed": ("vocab_size",),
    "block": ("n_heads", "ffn_hidden"),
    "head": ("vocab_size",),
}

LLAMA_TP_DIVISORS: dict[str, tuple[str, ...]] = {
    "embed": ("vocab_size",),
    "block": ("n_heads", "n_kv_heads", "ffn_hidden"),
    "head": ("vocab_size",),
}

# name -> table, so a LayerSpec.tp_plan such as "llama.block" can be looked up.
TP_PLANS: dict[str, dict[str, str]] = {
    **{f"gpt.{kind}": table for kind, table in GPT_TP_PLAN.items()},
    **{f"llama.{kind}": table for kind, table in LLAMA_TP_PLAN.items()},
}


def entries(table: dict[str, str] | None) -> list[tuple[str, str]]:
    """(module FQN, style) for each style of ``table``, a joined entry (``a+b``) giving one pair per style."""
    return [(fqn, style) for fqn, joined in (table or {}).items() for style in joined.split("+")]


def splits_sequence(table: dict[str, str] | None) -> bool:
    """Whether a unit with ``table`` holds only its TP rank's tokens under sequence parallelism: its input, or the
    input of the module doing its work (a transformers decoder layer inside its wrapper), is split along the sequence
    (``sp_unit``, ``sp_unit_in``). A unit without (an embedding) keeps its activations replicated over TP."""
    return any(style in ("sp_unit", "sp_unit_in") for _, style in entries(table))


def tp_norm_collectives(unit, table: dict[str, str]) -> int:
    """TP collectives per forward (and as many in backward) that the ``tp_norm`` entries of ``table`` add in
    ``unit``: one per norm with a 1-D weight, whose normalised vector spans every rank's heads (a norm with a
    (heads, head_dim) weight normalises each head on its own rank)."""
    return sum(1 for fqn, style in entries(table) if style == "tp_norm" and unit.get_submodule(fqn).weight.ndim == 1)
