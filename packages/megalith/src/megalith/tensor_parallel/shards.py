"""How a full tensor is cut into tensor-parallel shards, and the checks that come first.

A sharded Parameter carries `tp_spec` (a ShardSpec): the dimension it is cut along
and the sizes of the logical parts along it (one part for a plain linear; q, k, v
for a fused projection, so every rank keeps its slice of each). full_state_dict in
state.py uses it to put the full tensor back together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def check_divisible(what: str, n: int, tp: int) -> int:
    """n // tp, or ValueError naming both numbers (raised before any collective)."""
    if tp < 1 or n % tp:
        raise ValueError(
            f"tensor parallel size {tp} does not divide {what} ({n}): {n} % {tp} = {n % tp}; "
            f"choose a tp_size that divides {n}"
        )
    return n // tp


@dataclass(frozen=True)
class ShardSpec:
    dim: int
    parts: tuple[int, ...]  # full sizes along dim, in order; each divisible by tp

    def full_shape(self, local: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
        shape = list(local)
        shape[self.dim] = sum(self.parts)
        return tuple(shape)

    def take(self, full: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
        """This rank's shard of a full tensor (a copy)."""
        pieces, offset = [], 0
        for size in self.parts:
            local = size // tp
            pieces.append(full.narrow(self.dim, offset + rank * local, local))
            offset += size
        return torch.cat(pieces, dim=self.dim).clone()

    def join(self, shards: list[torch.Tensor]) -> torch.Tensor:
        """The full tensor from every rank's shard, in rank order."""
        tp = len(shards)
        split = [size // tp for size in self.parts]
        per_rank = [s.split(split, dim=self.dim) for s in shards]
        out = [per_rank[r][p] for p in range(len(self.parts)) for r in range(tp)]
        return torch.cat(out, dim=self.dim)


def shard_parameter(
    full: torch.Tensor, spec: ShardSpec, rank: int, tp: int, what: str
) -> torch.nn.Parameter:
    for size in spec.parts:
        check_divisible(what, size, tp)
    p = torch.nn.Parameter(spec.take(full.detach(), rank, tp), requires_grad=full.requires_grad)
    p.tp_spec = spec
    return p
