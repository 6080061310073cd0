"""The units container every transformers adapter returns (autopar.models.hf, hf_seq2seq), and the
causal mask their blocks are given."""

from __future__ import annotations

import torch
from torch import nn


def visible_keys(q_pos: torch.Tensor, seq_len: int, window: int | None = None) -> torch.Tensor:
    """Boolean ``[len(q_pos), seq_len]``: the keys a query at position p sees, 0..p, or with a sliding ``window``
    p - window + 1..p (transformers' sliding_window_overlay: key j is seen from query i when i - window < j <= i)."""
    keys = torch.arange(seq_len, device=q_pos.device)[None, :]
    seen = keys <= q_pos[:, None]
    return seen if window is None else seen & (keys > q_pos[:, None] - window)


def additive_mask(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 1, q, k]`` additive mask of a boolean ``seen``: 0 where seen, the dtype's minimum elsewhere."""
    return torch.zeros(seen.shape, device=seen.device, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)[None, None]


def causal_mask(x: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Additive ``[1, 1, S, S]`` causal mask of ``x [B, S, ...]``, with a sliding ``window`` if given."""
    s = x.shape[1]
    return additive_mask(visible_keys(torch.arange(s, device=x.device), s, window), x.dtype)


# transformers attention implementations whose kernel applies a layer's sliding window itself (the attention
# module passes ``sliding_window`` to it); the others see a window only through the mask they are given.
WINDOWED_KERNELS = frozenset({"flash_attention_2", "flash_attention_3"})


def sliding_window(attn: nn.Module) -> int | None:
    """The sliding window ``attn`` attends over, None for full attention: the module's own ``sliding_window``
    where it keeps one (Qwen2 / Qwen3 set it per layer from ``layer_types``), else its config's (Mistral's and
    Phi-3's apply to every layer) unless the config turns windows off (``use_sliding_window: false``, Qwen2-MoE,
    whose ``sliding_window`` then holds a placeholder) or marks this layer's type as full attention. A module
    whose ``is_sliding`` is false has none (EXAONE 4 keeps the config's window on its full layers too)."""
    if getattr(attn, "is_sliding", None) is False:
        return None
    if hasattr(attn, "sliding_window"):
        window = attn.sliding_window
    else:
        cfg = getattr(attn, "config", None)
        types, layer = getattr(cfg, "layer_types", None), getattr(attn, "layer_idx", None)
        if getattr(cfg, "use_sliding_window", True) is False or (
                types and isinstance(layer, int) and layer < len(types) and types[layer] != "sliding_attention"):
            return None
        window = getattr(cfg, "sliding_window", None)
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None


# transformers attention implementations that mask causally by themselves when given no mask: its
# sdpa_attention_forward sets ``is_causal = q_len > 1 and attention_mask is None`` (the module's is_causal),
# its flash paths use the module's ``is_causal``. Eager (and any other) applies only the mask it is given.
SELF_CAUSAL = frozenset({"sdpa", "flash_attention_2", "flash_attention_3"})


def block_mask(attn: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The mask a causal decoder block is given: None where ``attn``'s implementation (its config's
    ``_attn_implementation``) masks causally itself, else ``causal_mask(x)``; a sliding window shorter than the
    sequence is always given as a mask, except to the kernels that apply it themselves. An explicit mask sends SDPA
    from its flash kernel to a slower masked one and makes transformers expand GQA's K and V per head
    (measured on an H200: a Llama 3 8B layer's forward + backward at 8192 tokens, 33.6 ms with the mask,
    24.4 ms without; benchmarks/results/gpu_single_device.json, part mask)."""
    impl = getattr(getattr(attn, "config", None), "_attn_implementation", None)
    window = sliding_window(attn)
    if window is not None and x.shape[1] > window and impl not in WINDOWED_KERNELS:
        return causal_mask(x, window)  # as the HF model's own sliding-window mask: SDPA needs it explicit
    return None if impl in SELF_CAUSAL else causal_mask(x)


class HFBlock(nn.Module):
    """A transformers decoder layer taking ``(hidden_states, attention_mask=...)`` (GPT-2's, GPT-BigCode's, GPT-Neo's,
    OPT's), given the mask its attention (the layer's submodule ``attn``) needs, made from the whole sequence."""

    def __init__(self, block: nn.Module, attn: str = "attn") -> None:
        super().__init__()
        self.block, self.attn = block, attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x, attention_mask=block_mask(self.block.get_submodule(self.attn), x))
        return out[0] if isinstance(out, tuple) else out


class HFCausalLM(nn.Module):
    """tokens ``[B, S]`` -> logits ``[B, S, vocab]`` through ``embed``, ``layers``, ``head``."""

    def __init__(self, embed: nn.Module, layers: list[nn.Module], head: nn.Module, family: str,
                 tp_plans: dict[str, dict[str, str] | None], tp_divisors: dict[str, tuple[int, ...]],
                 selective: dict[str, tuple[str, ...]]) -> None:
        super().__init__()
        self.embed, self.layers, self.head = embed, nn.ModuleList(layers), head
        self.family, self.tp_plans, self.tp_divisors, self.selective_ckpt = family, tp_plans, tp_divisors, selective
        self.init_module = None  # the HF model's _init_weights (meta-device materialisation, runtime.materialize)
        self.context_parallel = False  # set by the view of a family whose blocks run under CP (autopar.models.hf)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(x)
