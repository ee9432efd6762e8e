"""NVMe chunks' states in host memory for a while: streamed around the step
(swapped_states) or all at once for checkpoints (resident_states)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from megalith_core.optim import flat_states

from . import nvme_chunk
from .chunk import OffloadableChunk
from .offloader import Offloader
from .swap import SwapStore

#: the optimizer states a chunk has (its param group's)
StateNames = Callable[[OffloadableChunk], tuple[str, ...]]


def swapped_states(
    offloader: Offloader, chunks: Sequence[tuple[OffloadableChunk, tuple[str, ...]]]
) -> Iterator[OffloadableChunk]:
    """Yields each NVMe chunk with its states (names given per chunk) read into host
    memory (`chunk.states`), and its master (`chunk.master`) when that lives in the
    file too; written back when the caller moves on. The next chunk's read overlaps
    the caller's work on this one."""
    if not chunks:
        return
    in_file = {id(c): offloader.swap_names(c.spec.index, names) for c, names in chunks}
    yield from [c for c, _ in chunks if not in_file[id(c)]]
    by_key = {c.spec.index: c for c, _ in chunks if in_file[id(c)]}
    for c, names in chunks:
        offloader.ensure_states(c, names)
    for key, states in offloader.swap.stream(list(by_key)):
        c = by_key[key]
        placeholder = c.master
        if offloader.masters_on_nvme(key):
            c.master = states.pop(SwapStore.MASTER)
        c.states = states
        try:
            yield c
        finally:
            c.states = {}
            c.master = placeholder


@contextlib.contextmanager
def resident_states(
    offloader: Offloader, chunks: Sequence[OffloadableChunk], names_of: StateNames
) -> Iterator[None]:
    """Inside: every NVMe chunk's states are plain host tensors in `chunk.states`, and
    every parameter shard kept in a swap file one in `chunk.shard` (for checkpoints,
    which read and write them directly); written back on a clean exit."""
    swapped = [c for c in chunks if offloader.tier_of(c.spec.index) == "nvme"]
    with_params = [c for c in swapped if offloader.params_on_nvme(c.spec.index)]
    names = {id(c): names_of(c) for c in swapped}
    in_file = {id(c): offloader.swap_names(c.spec.index, names[id(c)]) for c in swapped}
    swapped = [c for c in swapped if in_file[id(c)]]
    files: dict[int, dict[str, torch.Tensor]] = {}  # what each chunk's file holds
    for c in swapped:
        offloader.ensure_states(c, names[id(c)])
        vectors = flat_states.specs(in_file[id(c)], c.state_dtype, c.spec.shard_numel)
        files[id(c)] = {n: torch.empty(count, dtype=dtype) for n, (dtype, count) in vectors.items()}
        offloader.swap.load(c.spec.index, files[id(c)])
        c.states = dict(files[id(c)])
        if offloader.masters_on_nvme(c.spec.index):
            c.master = c.states.pop(SwapStore.MASTER)
    clean = False
    try:
        for c in with_params:
            nvme_chunk.load_params(offloader.swap.params, c)
        yield
        for c in swapped:
            offloader.swap.store(c.spec.index, files[id(c)])
        clean = True
    finally:
        for c in with_params:
            nvme_chunk.store_params(offloader.swap.params, c, write=clean)
        for c in swapped:
            c.states = {}
            if offloader.masters_on_nvme(c.spec.index):
                c.master = nvme_chunk.placeholder(c.master)
