"""A user-supplied Policy shards a model no built-in policy knows."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from megalith.tensor_parallel import (
    ColumnParallelLinear,
    Policy,
    RowParallelLinear,
    ShardContext,
    check_divisible,
    gather_full,
    shard_model,
)
from tests.tensor_parallel.common import check, mesh


class ToyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class ToyPolicy(Policy):
    name = "toy-mlp"

    def matches(self, model: nn.Module) -> bool:
        return isinstance(model, ToyMLP)

    def validate(self, model: nn.Module, tp: int) -> None:
        check_divisible("the toy MLP width", model.up.out_features, tp)

    def shard(self, model: nn.Module, ctx: ShardContext) -> None:
        model.up = ColumnParallelLinear.from_linear(model.up, ctx.group)
        model.down = RowParallelLinear.from_linear(model.down, ctx.group)


@dataclass(frozen=True)
class CustomCase:
    tp: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        group = mesh(1, self.tp).group("tp")
        torch.manual_seed(0)
        ref = ToyMLP()
        model = shard_model(copy.deepcopy(ref), group, policy=ToyPolicy())
        x = torch.randn(3, 8)
        ref(x).square().sum().backward()
        out = model(x)
        out.square().sum().backward()
        errors: list[str] = []
        check(errors, "output", out, ref(x))
        refs = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            check(
                errors,
                f"grad {name}",
                gather_full(p.grad, group, getattr(p, "tp_spec", None)),
                refs[name].grad,
            )
        return errors, time.perf_counter() - start
