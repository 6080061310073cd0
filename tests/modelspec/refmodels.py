"""Eager-attention GPT and Llama written out op by op (softmax(QK^T)V, as Korthikanti et al. count it),
to check the zoo's activation formulas; autopar.models uses SDPA, whose saved tensors differ by kernel.
Children ``embed``, ``layers`` (ModuleList), ``head``; ``gpt_tiny`` is a factory of autopar.models' GPT."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, bias: bool, rope: bool, seq: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, h // heads
        self.q = nn.Linear(h, h, bias=bias)
        self.k = nn.Linear(h, kv_heads * self.hd, bias=bias)
        self.v = nn.Linear(h, kv_heads * self.hd, bias=bias)
        self.o = nn.Linear(h, h, bias=bias)
        self.register_buffer("future", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)
        self.rope = rope
        if rope:
            inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
            ang = torch.outer(torch.arange(seq).float(), inv)
            self.register_buffer("cos", torch.cat([ang, ang], -1).cos(), persistent=False)
            self.register_buffer("sin", torch.cat([ang, ang], -1).sin(), persistent=False)

    def _rot(self, x):
        s = x.shape[2]
        x1, x2 = x.chunk(2, -1)
        return x * self.cos[:s] + torch.cat([-x2, x1], -1) * self.sin[:s]

    def forward(self, x):
        b, s, h = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        if self.rope:
            q, k = self._rot(q), self._rot(k)
        rep = self.heads // self.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(self.future[:s, :s], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, s, h)
        return self.o(y)


class GPTBlock(nn.Module):
    def __init__(self, h, heads, ffn, seq):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.attn = Attention(h, heads, heads, True, False, seq)
        self.fc1, self.fc2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LlamaBlock(nn.Module):
    def __init__(self, h, heads, kv_heads, ffn, seq):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
        self.attn = Attention(h, heads, kv_heads, False, True, seq)
        self.gate, self.up = nn.Linear(h, ffn, bias=False), nn.Linear(h, ffn, bias=False)
        self.down = nn.Linear(ffn, h, bias=False)

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Embed(nn.Module):
    def __init__(self, vocab, h, seq, learned_pos):
        super().__init__()
        self.tok = nn.Embedding(vocab, h)
        self.pos = nn.Embedding(seq, h) if learned_pos else None

    def forward(self, ids):
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return x


class Head(nn.Module):
    def __init__(self, h, vocab, norm):
        super().__init__()
        self.norm = norm
        self.out = nn.Linear(h, vocab, bias=False)

    def forward(self, x):
        return self.out(self.norm(x))


class LM(nn.Module):
    def __init__(self, embed, layers, head):
        super().__init__()
        self.embed, self.layers, self.head = embed, nn.ModuleList(layers), head

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def gpt(layers=4, h=64, heads=4, ffn=256, vocab=256, seq=32) -> LM:
    return LM(Embed(vocab, h, seq, True), [GPTBlock(h, heads, ffn, seq) for _ in range(layers)],
              Head(h, vocab, nn.LayerNorm(h)))


def llama(layers=4, h=64, heads=4, kv_heads=2, ffn=176, vocab=256, seq=32) -> LM:
    return LM(Embed(vocab, h, seq, False), [LlamaBlock(h, heads, kv_heads, ffn, seq) for _ in range(layers)],
              Head(h, vocab, nn.RMSNorm(h)))


def gpt_tiny() -> nn.Module:
    """Factory for load_model tests: autopar.models' GPT in the zoo's gpt-tiny shape."""
    from autopar.models import GPT, GPTConfig

    return GPT(GPTConfig(seq_len=32, n_layers=4))
