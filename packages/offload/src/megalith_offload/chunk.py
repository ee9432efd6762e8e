"""What megalith_offload needs of a chunk: megalith_zero's FlatChunk is one.

Offloading never imports megalith_zero; it works on any object with these members,
tensors and plain attributes only, and calls none of its methods. Where a chunk's
state lives (its tier, parameter shards on the host or in a file, a master in the
swap file) is the Offloader's record, not the chunk's: the chunk holds the tensors,
the Offloader says where they are, moves them, and brings those in swap files into
host memory (nvme_chunk.py).
"""

from __future__ import annotations

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
    #: this rank's position in the chunk's group (which shard it holds)
    rank: int
    trainable: bool
    #: the device arena (device memory for a chunk moved back to the device)
    memory: StateMemory
    #: the gathered working parameters (their storage is model memory, not activations)
    full: torch.Tensor
    #: this rank's working parameters: written by the host update; a meta tensor while
    #: they live in a swap file; the Offloader replaces it when it moves them
    shard: torch.Tensor
    shard_grad: torch.Tensor
    #: the fp32 master shard; a meta tensor while it lives in the swap file
    master: torch.Tensor
    #: optimizer states by name; on NVMe filled only around the chunk's step
    states: dict[str, torch.Tensor]
    #: their format: "fp32", "bf16" or "int8" (megalith_core.optim.flat_states; the
    #: int8 format adds the block scales to `states`)
    state_dtype: str


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
