"""Small models for the pipeline tests, built the same way on every rank from a seed.

- mlp: an nn.Sequential of residual tanh layers (tensor in, tensor out).
- mixed: layers that pass dicts and tuples holding tensors without grad (a float
  mask, integer ids) and a None, so that whatever the cut, stages exchange them.
- tiny_gpt2: transformers' GPT2LMHeadModel layout (transformer.wte/wpe/drop/h/ln_f,
  lm_head tied to wte), split by megalith_pipeline's gpt2_parts.
- sleepy: layers that sleep a fixed time in forward, input-gradient and
  weight-gradient passes (for comparing measured idle time with the simulator).
"""

from __future__ import annotations

import time

import torch
from torch import nn

DIM = 8


class Residual(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


def mlp(n_layers: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(4, DIM), *[Residual(DIM) for _ in range(n_layers - 2)], nn.Linear(DIM, 3)
    )


class ToDict(nn.Module):
    """x -> {"h": hidden, "mask": float mask (no grad), "ids": int64, "note": None}."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, DIM)

    def forward(self, x: torch.Tensor) -> dict:
        mask = (x[:, :1] > 0).float()
        ids = (x[:, 1] * 10).long().abs() % 5
        return {"h": self.lin(x), "mask": mask, "ids": ids, "note": None}


class DictBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.emb = nn.Embedding(5, DIM)

    def forward(self, d: dict) -> dict:
        h = d["h"] + torch.tanh(self.lin(d["h"])) * (1 + d["mask"]) + 0.1 * self.emb(d["ids"])
        return {**d, "h": h}


class ToTuple(nn.Module):
    """dict -> (hidden, a second output that also needs grad, the mask without grad)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)

    def forward(self, d: dict) -> tuple:
        return self.lin(d["h"]), d["h"].sum(dim=1, keepdim=True), d["mask"]


class TupleBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)

    def forward(self, t: tuple) -> tuple:
        h, side, mask = t
        return h + torch.tanh(self.lin(h)) * mask + side, side * 0.5, mask


class TupleHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(DIM, 3)

    def forward(self, t: tuple) -> torch.Tensor:
        h, side, _ = t
        return self.lin(h) + side


def mixed(n_layers: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    n_dict = (n_layers - 3) // 2
    n_tuple = n_layers - 3 - n_dict
    return nn.Sequential(
        ToDict(),
        *[DictBlock() for _ in range(n_dict)],
        ToTuple(),
        *[TupleBlock() for _ in range(n_tuple)],
        TupleHead(),
    )


# -- a GPT-2 laid out as transformers lays it out -----------------------------
class GPT2Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, None]:
        t = hidden.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        x = self.ln_1(hidden)
        hidden = hidden + self.attn(x, x, x, attn_mask=causal, need_weights=False)[0]
        return hidden + self.mlp(self.ln_2(hidden)), None  # transformers returns a tuple


class _Transformer(nn.Module):
    def __init__(self, vocab: int, seq: int, dim: int, layers: int, heads: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.drop = nn.Dropout(0.0)
        self.h = nn.ModuleList(GPT2Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)


class TinyGPT2(nn.Module):
    def __init__(
        self, vocab: int = 32, seq: int = 8, dim: int = 16, layers: int = 4, heads: int = 2
    ):
        super().__init__()
        self.transformer = _Transformer(vocab, seq, dim, layers, heads)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as GPT-2's

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        h = t.drop(t.wte(ids) + t.wpe(torch.arange(ids.shape[1])))
        for block in t.h:
            h = block(h)[0]
        return self.lm_head(t.ln_f(h))


def tiny_gpt2(layers: int, seed: int = 0) -> TinyGPT2:
    torch.manual_seed(seed)
    return TinyGPT2(layers=layers)


# -- layers with known pass times -----------------------------------------------
class _SleepBackward(torch.autograd.Function):
    """Identity forward; the backward sleeps (a fixed cost for one gradient edge)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        time.sleep(ctx.seconds)
        return grad, None


class Sleepy(nn.Module):
    """y = sleepI(x) * sleepW(w): forward sleeps f; the input gradient costs i, the weight
    gradient w, in separate graph nodes (so the I/W split sees them apart)."""

    def __init__(self, f: float, i: float, w: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.f, self.i, self.w = f, i, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.f)
        x = _SleepBackward.apply(x, self.i) if x.requires_grad else x
        return x * _SleepBackward.apply(self.weight, self.w)


def sleepy(n_layers: int, f: float, i: float, w: float) -> nn.Sequential:
    return nn.Sequential(*[Sleepy(f, i, w) for _ in range(n_layers)])
