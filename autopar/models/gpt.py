"""Reference GPT in plain torch: learned positions, LayerNorm, GELU MLP, causal attention.

Children ``embed`` / ``layers`` / ``head`` are the plan's units. Q, K and V are separate linears so a
column split keeps whole heads on each TP rank; attention infers its local head count from the
projection width, so the same code runs sharded or not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from autopar.models.tp_plans import GPT_TP_DIVISORS, GPT_TP_PLAN
from autopar.units import AttentionCore


@dataclass
class GPTConfig:
    vocab_size: int = 256
    seq_len: int = 64
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    ffn_hidden: int = 256
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class GPTEmbed(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.seq_len, cfg.dim)
        self.cp_positions = None  # context parallel: (local length, device) -> true positions

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        positions = torch.arange(s, device=tokens.device) if self.cp_positions is None else self.cp_positions(
            s, tokens.device)
        return self.tok(tokens) + self.pos(positions)


class GPTAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.q = nn.Linear(cfg.dim, cfg.dim)
        self.k = nn.Linear(cfg.dim, cfg.dim)
        self.v = nn.Linear(cfg.dim, cfg.dim)
        self.core = AttentionCore()
        self.o = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = self.core(q, k, v).transpose(1, 2).reshape(b, s, -1)
        return self.o(y)


class GPTMLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.dim, cfg.ffn_hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(cfg.ffn_hidden, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class GPTBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = GPTAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = GPTMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTHead(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.proj = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class GPT(nn.Module):
    """tokens ``[B, S]`` (int64) -> logits ``[B, S, vocab]``."""

    family = "gpt"
    tp_plans = GPT_TP_PLAN
    context_parallel = True  # positions and attention core follow autopar.runtime.context_parallel

    @property
    def tp_divisors(self) -> dict[str, tuple[int, ...]]:
        """Unit kind -> the config numbers a TP degree must divide."""
        return {kind: tuple(int(getattr(self.config, f)) for f in fields)
                for kind, fields in GPT_TP_DIVISORS.items()}

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = GPTEmbed(cfg)
        self.layers = nn.ModuleList(GPTBlock(cfg) for _ in range(cfg.n_layers))
        self.head = GPTHead(cfg)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(x)
