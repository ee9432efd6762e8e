"""A small model with every shape of trouble ZeRO must handle, and its plain torch reference.

Sizes are odd (nothing divides by 2, 3 or 4), the output head is tied to the
embedding, one Linear is called twice per forward, one Linear is never called,
and the batch (12 rows) splits evenly over 1, 2, 3 and 4 ranks.
"""

from __future__ import annotations

import torch
from torch import nn

import megalith_comm as comm

VOCAB, DIM, BATCH, SEQ = 37, 19, 12, 5


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 3 * DIM + 1)
        self.down = nn.Linear(3 * DIM + 1, DIM)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(torch.tanh(self.up(self.norm(h))))


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.twice = nn.Linear(DIM, DIM)
        self.unused = nn.Linear(DIM, 7)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        h = self.twice(torch.tanh(self.twice(h)))
        return self.head(h)


def make_model(seed: int) -> Toy:
    torch.manual_seed(seed)
    return Toy()


def batches(
    seed: int, steps: int, accumulate: int
) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed + 1)
    return [
        [
            (
                torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
                torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
            )
            for _ in range(accumulate)
        ]
        for _ in range(steps)
    ]


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x).reshape(-1, VOCAB).float(), y.reshape(-1))


def zero_step(zmodel, zopt, x: torch.Tensor, y: torch.Tensor, max_norm: float | None = None):
    """One megalith_zero step on this rank's rows of the batch (BATCH splits evenly over
    the group); returns the loss averaged over the group."""
    rank, n = zmodel.group.rank, zmodel.group.size
    rows = slice(rank * BATCH // n, (rank + 1) * BATCH // n)
    loss = loss_fn(zmodel, x[rows], y[rows])
    zopt.backward(loss)
    if max_norm is not None:
        zopt.clip_grad_norm_(max_norm)
    zopt.step()
    zopt.zero_grad()
    total = loss.detach().double()
    comm.all_reduce(total, op="avg", group=zmodel.group)
    return float(total)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


def reference(seed: int, steps: int, accumulate: int, max_norm: float | None, lr: float = 1e-2):
    """Plain single-process torch AdamW: (losses, final parameters by name)."""
    model = make_model(seed)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=lr)
    losses = []
    for micro in batches(seed, steps, accumulate):
        total = 0.0
        for x, y in micro:
            loss = loss_fn(model, x, y) / accumulate
            loss.backward()
            total += loss.item()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def reference_mixed(seed: int, steps: int, dtype: torch.dtype, lr: float = 1e-2):
    """Single-process fp32-master mixed precision, the algorithm ZeRO runs, without sharding:
    the model computes in `dtype`, AdamW updates fp32 masters, masters are rounded back."""
    master = make_model(seed)
    model = make_model(seed).to(dtype)
    opt = torch.optim.AdamW(param_groups(master, 0.1), lr=lr)
    losses = []
    for micro in batches(seed, steps, 1):
        x, y = micro[0]
        loss = loss_fn(model, x, y)
        loss.backward()
        for pm, pw in zip(master.parameters(), model.parameters()):
            pm.grad = None if pw.grad is None else pw.grad.float()
            pw.grad = None
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for pm, pw in zip(master.parameters(), model.parameters()):
                pw.copy_(pm)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().clone() for n, p in master.named_parameters()}
