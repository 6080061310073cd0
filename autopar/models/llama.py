"""Reference Llama in plain torch: RMSNorm, rotary positions (RoPE), SwiGLU MLP, grouped-query attention.

Children ``embed`` / ``layers`` / ``head`` are the plan's units. RoPE tables are computed in forward
(no buffers), so a model built on the meta device needs nothing but its parameters materialised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autopar.models.tp_plans import LLAMA_TP_DIVISORS, LLAMA_TP_PLAN
from autopar.units import AttentionCore


@dataclass
class LlamaConfig:
    vocab_size: int = 256
    seq_len: int = 64
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_hidden: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def rope(x: torch.Tensor, theta: float, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate ``x [B, heads, S, head_dim]`` by position (rotate-half convention); ``positions``: the
    tokens' true positions (default 0..S-1; context parallel passes a rank's own)."""
    s, d = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    pos = torch.arange(s, device=x.device) if positions is None else positions
    angles = torch.outer(pos.to(torch.float32), inv_freq)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class LlamaEmbed(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.head_dim, self.theta = cfg.head_dim, cfg.rope_theta
        self.group = cfg.n_heads // cfg.n_kv_heads  # query heads per KV head (unchanged by TP)
        self.kv_repeat = self.group  # context parallel gathers K and V before this repeat
        self.q = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.core = AttentionCore()
        self.o = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.cp_positions = None  # context parallel: (local length, device) -> true positions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        pos = self.cp_positions(s, x.device) if self.cp_positions is not None else None
        q, k = rope(q, self.theta, pos), rope(k, self.theta, pos)
        k = k.repeat_interleave(self.group, dim=1)
        v = v.repeat_interleave(self.group, dim=1)
        y = self.core(q, k, v).transpose(1, 2).reshape(b, s, -1)
        return self.o(y)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = LlamaAttention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.ffn_norm(x))


class LlamaHead(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.proj = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class Llama(nn.Module):
    """tokens ``[B, S]`` (int64) -> logits ``[B, S, vocab]``."""

    family = "llama"
    tp_plans = LLAMA_TP_PLAN
    context_parallel = True  # positions and attention core follow autopar.runtime.context_parallel

    @property
    def tp_divisors(self) -> dict[str, tuple[int, ...]]:
        """Unit kind -> the config numbers a TP degree must divide."""
        return {kind: tuple(int(getattr(self.config, f)) for f in fields)
                for kind, fields in LLAMA_TP_DIVISORS.items()}

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = LlamaEmbed(cfg)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layers))
        self.head = LlamaHead(cfg)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(x)
