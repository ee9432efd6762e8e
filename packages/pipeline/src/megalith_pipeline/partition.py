"""Cutting a list of layers into consecutive stages, balanced by a cost per layer.

    plan = partition(layers, num_stages=4, balance="params")
    plan.sizes                 # layers per stage, e.g. (3, 2, 2, 3)
    plan.layers(2)             # range of layer indices of stage 2

balance: "layers" (equal counts; the first stages take one more when it does not
divide), "params" (parameter count per layer), "time" (forward + backward time
per layer, measured on a sample micro-batch by profile.layer_times and averaged
over the ranks so that every rank cuts the same way), explicit per-stage sizes,
or explicit per-layer costs (`costs=`). Costs are cut by dynamic programming:
the heaviest stage is as light as possible, and among such cuts the one with
the most even stages (least sum of squares) wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import megalith_comm as comm

from .profile import layer_times

BALANCES = ("layers", "params", "time")


@dataclass(frozen=True)
class Partition:
    """bounds[s]:bounds[s+1] are the layer indices of stage s."""

    bounds: tuple[int, ...]
    costs: tuple[float, ...] = ()

    @property
    def num_stages(self) -> int:
        return len(self.bounds) - 1

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.bounds, self.bounds[1:]))

    def layers(self, stage: int) -> range:
        return range(self.bounds[stage], self.bounds[stage + 1])

    def stage_costs(self) -> tuple[float, ...]:
        """Each stage's summed cost (empty when the cut was by explicit sizes)."""
        if not self.costs:
            return ()
        return tuple(sum(self.costs[a:b]) for a, b in zip(self.bounds, self.bounds[1:]))

    @classmethod
    def from_sizes(cls, sizes: Sequence[int], costs: Sequence[float] = ()) -> Partition:
        bounds = [0]
        for n in sizes:
            bounds.append(bounds[-1] + n)
        return cls(tuple(bounds), tuple(costs))


def _check(num_layers: int, num_stages: int) -> None:
    if num_stages < 1:
        raise ValueError(f"partition: num_stages={num_stages}; expected >= 1")
    if num_layers < num_stages:
        raise ValueError(
            f"partition: {num_layers} layers cannot fill {num_stages} stages (pp x chunks); "
            "every stage needs at least one layer: lower pp or chunks, or split the model finer"
        )


def balance_costs(costs: Sequence[float], num_stages: int) -> Partition:
    """Consecutive stages minimising the heaviest stage's cost (then the sum of squares)."""
    n = len(costs)
    _check(n, num_stages)
    if any(c < 0 for c in costs):
        raise ValueError(f"partition: layer costs must be >= 0, got {list(costs)}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = (float("inf"), float("inf"))
    # best[k][i]: (max, sum of squares) cutting the first i layers into k stages
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                prev = best[k - 1][j]
                if prev == inf:
                    continue
                w = prefix[i] - prefix[j]
                cand = (max(prev[0], w), prev[1] + w * w)
                if cand < best[k][i]:
                    best[k][i], cut[k][i] = cand, j
    bounds, i = [n], n
    for k in range(num_stages, 0, -1):
        i = cut[k][i]
        bounds.append(i)
    return Partition(tuple(reversed(bounds)), tuple(float(c) for c in costs))


def even_sizes(num_layers: int, num_stages: int) -> tuple[int, ...]:
    _check(num_layers, num_stages)
    q, r = divmod(num_layers, num_stages)
    return tuple(q + (1 if s < r else 0) for s in range(num_stages))


def param_costs(layers: Sequence[nn.Module]) -> list[float]:
    """Parameters per layer; a parameter shared by several layers counts in the first."""
    seen: set[int] = set()
    out = []
    for layer in layers:
        n = 0
        for p in layer.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        out.append(float(n))
    return out


def partition(
    layers: Sequence[nn.Module],
    num_stages: int,
    balance: str | Sequence[int] = "layers",
    *,
    sample: Any = None,
    costs: Sequence[float] | None = None,
    group: Any = None,
) -> Partition:
    """Cuts `layers` into num_stages consecutive stages (see the module docstring).

    sample: one micro-batch of model input, for balance="time". group: the
    megalith_comm group whose ranks average their measured times (default: all
    ranks; every rank of it must call partition).
    """
    n = len(layers)
    if costs is not None:
        if len(costs) != n:
            raise ValueError(f"partition: {len(costs)} costs for {n} layers")
        return balance_costs(costs, num_stages)
    if not isinstance(balance, str):
        sizes = tuple(int(s) for s in balance)
        if len(sizes) != num_stages or sum(sizes) != n or min(sizes, default=0) < 1:
            raise ValueError(
                f"partition: balance={list(sizes)} must give {num_stages} stages of at least one "
                f"layer summing to the {n} layers"
            )
        return Partition.from_sizes(sizes)
    if balance == "layers":
        return Partition.from_sizes(even_sizes(n, num_stages), [1.0] * n)
    if balance == "params":
        return balance_costs(param_costs(layers), num_stages)
    if balance == "time":
        if sample is None:
            raise ValueError("partition: balance='time' needs sample=<one micro-batch of input>")
        _check(n, num_stages)
        times = torch.tensor(layer_times(layers, sample), dtype=torch.float64)
        if comm.is_initialized() and comm.get_world().world_size > 1:
            comm.all_reduce(times, op="avg", group=group)  # every rank cuts the same way
        return balance_costs(times.tolist(), num_stages)
    raise ValueError(f"partition: balance={balance!r}; expected one of {BALANCES} or stage sizes")
