"""The benchmark's model: a small decoder-only GPT (pre-norm blocks, learned positions,
untied head), exposed as (embedding, blocks, head) through pipeline_parts()."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 2048
    dim: int = 128
    layers: int = 8
    heads: int = 4
    seq: int = 64


class Embedding(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.tokens = nn.Embedding(c.vocab, c.dim)
        self.positions = nn.Embedding(c.seq, c.dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads = c.heads
        self.norm1, self.norm2 = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.qkv, self.out = nn.Linear(c.dim, 3 * c.dim), nn.Linear(c.dim, c.dim)
        self.up, self.down = nn.Linear(c.dim, 4 * c.dim), nn.Linear(4 * c.dim, c.dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        qkv = self.qkv(self.norm1(h)).reshape(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.out(att.transpose(1, 2).reshape(b, t, d))
        return h + self.down(nn.functional.gelu(self.up(self.norm2(h))))


class Head(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(c.dim), nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(h))


class SmallGPT(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.embedding = Embedding(c)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.head = Head(c)

    def pipeline_parts(self) -> tuple[nn.Module, list[nn.Module], nn.Module]:
        return self.embedding, list(self.blocks), self.head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embedding(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
