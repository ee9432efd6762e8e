"""What megalith_offload needs of a chunk: megalith_zero's FlatChunk is one.

Offloading never imports megalith_zero; it works on any object with these members.
Where a chunk's state lives (its tier, parameter shards on the host or in a file, a
master in the swap file) is the Offloader's record, not the chunk's: the chunk holds
the tensors, the Offloader says where they are and moves them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch

from megalith_core.memory import StateMemory


class ChunkSpec(Protocol):
    @property
    def index(self) -> int: ...  # the chunk's key in the Offloader and its swap files

    @property
    def group(self) -> int: ...  # its optimizer param group

    @property
    def shard_numel(self) -> int: ...  # elements of this rank's shard


class OffloadableChunk(Protocol):
    spec: ChunkSpec
    trainable: bool
    #: the device arena (device memory for a chunk moved back to the device)
    memory: StateMemory
    #: the gathered working parameters (their storage is model memory, not activations)
    full: torch.Tensor
    #: this rank's working parameters: written by the host update
    shard: torch.Tensor
    shard_grad: torch.Tensor
    #: the fp32 master shard; a meta tensor while it lives in the swap file
    master: torch.Tensor
    #: optimizer states by name; on NVMe filled only around the chunk's step
    states: dict[str, torch.Tensor]

    def swap_names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The vectors of the chunk's swap file, for optimizer states `names`."""
        ...

    def ensure_states(self, names: tuple[str, ...]) -> None:
        """The optimizer states `names` exist (zeros until first stepped)."""
        ...

    def staged_params(self, read: bool = True) -> contextlib.AbstractContextManager[None]:
        """Inside: a parameter shard kept in a swap file is a host tensor in `shard`."""
        ...

    def resident_params(self) -> None:
        """A swap-file parameter shard as a host tensor in `shard` until store_params()."""
        ...

    def store_params(self, write: bool = True) -> None: ...

    def replace_shard(self, shard: torch.Tensor) -> None:
        """The working-parameter shard is now `shard` (moved between tiers)."""
        ...


class ChunkUpdate(Protocol):
    """One chunk's update in a step, as a tier's step() takes it."""

    @property
    def chunk(self) -> OffloadableChunk: ...

    @property
    def group(self) -> dict[str, Any]: ...  # the optimizer param group (hyperparameters)

    @property
    def names(self) -> tuple[str, ...]: ...  # its optimizer states

    @property
    def pieces(self) -> list[tuple[int, slice, list[int]]]:
        """(step number to take, shard range, slot indices) runs of the update."""
        ...
