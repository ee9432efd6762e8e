"""A chunk's tensors kept in its swap files (swap.py): the fp32 master ahead of its
optimizer states (master_tier="nvme"), and the working-parameter shard in a file of its
own (param_tier="nvme", [Note: parameter files]). In the chunk such a tensor is a meta
tensor (its shape and dtype, no values) except while it is held in host memory: around
the chunk's step, and in the checkpoints (resident.py). The Offloader says which of a
chunk's tensors are in files, and calls these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .chunk import OffloadableChunk
from .swap import MASTER, ParamFiles, SwapStore


def placeholder(t: torch.Tensor) -> torch.Tensor:
    """`t`'s shape and dtype without values: they are in a swap file."""
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def put_params(files: ParamFiles, chunk: OffloadableChunk) -> None:
    """Moves the chunk's parameter shard (its values in `shard`) into a file of its own."""
    key = chunk.spec.index
    files.ensure(key, chunk.spec.shard_numel, chunk.shard.dtype)
    files.store(key, chunk.shard)
    chunk.shard = placeholder(chunk.shard)


def put_master(swap: SwapStore, chunk: OffloadableChunk, names: tuple[str, ...]) -> None:
    """Moves the chunk's fp32 master (its values in `master`) into its states' file, whose
    vectors are `names` (MASTER first)."""
    key = chunk.spec.index
    swap.ensure(key, names, chunk.spec.shard_numel, chunk.state_dtype)
    swap.store(key, {MASTER: chunk.master})
    chunk.master = placeholder(chunk.master)


def master_values(swap: SwapStore, chunk: OffloadableChunk) -> torch.Tensor:
    """The master read from its file, as a new host tensor."""
    out = torch.empty(chunk.spec.shard_numel, dtype=torch.float32)
    swap.load(chunk.spec.index, {MASTER: out})
    return out


@contextlib.contextmanager
def staged_params(files: ParamFiles, chunk: OffloadableChunk, read: bool = True) -> Iterator[None]:
    """Inside: the parameter shard in host staging as `shard` (read=False: not read, for
    an update that overwrites all of it), written back to its file on a clean exit."""
    try:
        with files.staged(chunk.spec.index, read) as view:
            chunk.shard = view
            yield
    finally:
        chunk.shard = placeholder(chunk.shard)


def load_params(files: ParamFiles, chunk: OffloadableChunk) -> None:
    """The parameter shard as a host tensor in `shard` until store_params()."""
    chunk.shard = files.load(chunk.spec.index)


def store_params(files: ParamFiles, chunk: OffloadableChunk, write: bool = True) -> None:
    """Ends load_params(): writes `shard` back to its file (unless write=False)."""
    if chunk.shard.device.type != "meta":
        if write:
            files.store(chunk.spec.index, chunk.shard)
        chunk.shard = placeholder(chunk.shard)
