"""DropoutForParallelInput and DropoutForReplicatedInput: dropout with a random stream of
its own, so the masks do not depend on how much randomness the rest of the step drew.

ParallelInput: each rank holds a different slice, so its stream is offset by its rank
in the group (different masks). ReplicatedInput: every rank holds the same tensor, so
every rank draws the same mask and the replicas stay equal. The base seed is
torch.initial_seed() plus the layer's index (layers are built in the same order on
every rank, as ColossalAI requires).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import megalith_comm

from .groups import comm_group

#: the next dropout layer's index (its seed offset); utils.Randomizer reads and resets it
_index = [0]


def next_index() -> int:
    i = _index[0]
    _index[0] += 1
    return i


class _StreamDropout(nn.Dropout):
    offset_by_rank = True

    def __init__(self, p: float = 0.5, inplace: bool = False, process_group: Any = None) -> None:
        super().__init__(p=p, inplace=inplace)
        rank = 0
        if process_group is not None or megalith_comm.is_initialized():
            rank = comm_group(process_group, type(self).__name__).rank
        seed = torch.initial_seed() + next_index() + (rank if self.offset_by_rank else 0)
        self.seed = seed
        self._states: dict[str, torch.Tensor] = {}

    @classmethod
    def from_native_module(cls, module: nn.Dropout, process_group: Any = None) -> nn.Module:
        return cls(p=module.p, inplace=module.inplace, process_group=process_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        devices = [x.device] if x.device.type == "cuda" else []
        key = str(x.device)
        with torch.random.fork_rng(devices=devices):
            if key in self._states:
                _set_state(x.device, self._states[key])
            else:
                _seed(x.device, self.seed)
            out = super().forward(x)
            self._states[key] = _get_state(x.device)
        return out


def _seed(device: torch.device, seed: int) -> None:
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def _get_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


class DropoutForParallelInput(_StreamDropout):
    offset_by_rank = True


class DropoutForReplicatedInput(_StreamDropout):
    offset_by_rank = False
