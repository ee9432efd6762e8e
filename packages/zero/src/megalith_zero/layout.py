"""Where every parameter lives: chunks of consecutive parameters, and each rank's shard of a chunk.

A chunk is one flat buffer holding several parameters of one optimizer param
group at aligned offsets, padded so that it splits into `world` equal shards.
Rank r owns elements [r * S, (r + 1) * S) of every chunk (S = numel / world):
its fp32 master copy, optimizer states and reduced gradients of exactly those
elements. A shard may start or end inside a parameter; `Chunk.segments(r)` says
which parts of which parameters it holds.

The layout depends only on the parameters, the param groups, the chunk size and
the world size, so every rank computes the same one without talking, and a
checkpoint written under one layout can be mapped onto another by parameter
name and element range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Parameters start at multiples of this many elements (64 bytes of fp32), so
#: each one's view is aligned for the engine's SIMD kernels.
ALIGN_ELEMENTS = 16

#: Models up to this size (of working parameters) are laid out as a single chunk.
SMALL_MODEL_BYTES = 32 << 20


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class Slot:
    """One parameter inside a chunk."""

    param: int  # index in the layout's parameter list
    name: str
    shape: tuple[int, ...]
    offset: int  # first element in the chunk

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Segment:
    """Elements [param_start, param_start + length) of a parameter, held at
    [shard_start, shard_start + length) of a rank's shard."""

    slot: Slot
    param_start: int
    shard_start: int
    length: int


@dataclass(frozen=True)
class Chunk:
    index: int
    group: int  # optimizer param group
    numel: int  # padded: a multiple of world * ALIGN_ELEMENTS
    slots: tuple[Slot, ...]
    world: int
    #: with shard_each_param: the bucket of consecutive chunks whose gradient reduction
    #: and parameter gather are one collective ([Note: coalesced per-parameter shards]
    #: in buckets.py); -1: the chunk's collectives are its own
    bucket: int = -1

    @property
    def shard_numel(self) -> int:
        return self.numel // self.world

    @property
    def used(self) -> int:
        last = self.slots[-1]
        return last.offset + last.numel

    def segments(self, rank: int) -> list[Segment]:
        lo, hi = rank * self.shard_numel, (rank + 1) * self.shard_numel
        out = []
        for s in self.slots:
            a, b = max(lo, s.offset), min(hi, s.offset + s.numel)
            if a < b:
                out.append(Segment(s, a - s.offset, a - lo, b - a))
        return out


@dataclass(frozen=True)
class Layout:
    world: int
    chunks: tuple[Chunk, ...]
    names: tuple[str, ...]  # parameter names by index

    def slot_of(self, param: int) -> tuple[Chunk, Slot]:
        for c in self.chunks:
            for s in c.slots:
                if s.param == param:
                    return c, s
        raise KeyError(param)

    def state_bytes(self, dtype_bytes: int) -> int:
        return sum(c.numel for c in self.chunks) * dtype_bytes


def chunk_numel_for(numels: Sequence[int], chunk_bytes: int, element_bytes: int, world: int) -> int:
    """Capacity in elements: chunk_bytes when given (at least the largest parameter),
    else the engine's search for the least padding, among capacities from 1 MiB up to
    an eighth of the model (at most 64 MiB, at least the largest parameter): small
    enough that reductions overlap backward and stage 3 holds a fraction of the
    model at a time, large enough that each collective moves a useful amount.
    A model of at most SMALL_MODEL_BYTES is one chunk: there, each collective's
    latency costs more than overlap could save, and memory is no concern."""
    align = world * ALIGN_ELEMENTS
    largest = max((round_up(n, ALIGN_ELEMENTS) for n in numels), default=ALIGN_ELEMENTS)
    if chunk_bytes:
        return round_up(max(chunk_bytes // element_bytes, largest), align)
    from megalith_core import _engine

    sizes = [round_up(n, ALIGN_ELEMENTS) * element_bytes for n in numels]
    if sum(sizes) <= SMALL_MODEL_BYTES:
        return round_up(sum(sizes) // element_bytes, align)
    hi = max(min(64 << 20, sum(sizes) // 8), max(sizes))
    lo = min(1 << 20, hi)
    capacity, _ = _engine.memory.search_chunk_capacity(
        sizes, lo, hi, ALIGN_ELEMENTS * element_bytes
    )
    return round_up(max(capacity // element_bytes, largest), align)


def bucket_numel_for(
    numels: Sequence[int], chunk_bytes: int, element_bytes: int, world: int
) -> int:
    """The capacity in elements of a bucket of one-parameter chunks (shard_each_param):
    chunk_bytes of the working dtype when given (smaller than a parameter: that
    parameter alone), else what chunk_numel_for would choose for chunks of the
    one-parameter chunks' (padded) sizes; either way at most an eighth of them all
    (chunk_bytes=1: one parameter a bucket). A bucket's gradients are in flight twice
    while it reduces (its members' and the rank-major packed copy, buckets.py): a
    whole-model bucket would hold more gradient bytes than DDP does, and ZeRO-2 (also
    offloaded) would lose its device-memory advantage on models smaller than a bucket."""
    align = world * ALIGN_ELEMENTS
    padded = [round_up(n, align) for n in numels]
    if chunk_bytes:
        wanted = chunk_bytes // element_bytes
    else:
        wanted = chunk_numel_for(padded, 0, element_bytes, world)
    return max(1, min(wanted, -(-sum(padded) // 8)))


def _buckets(chunks: list[Chunk], capacity: int) -> list[Chunk]:
    """Numbers consecutive trainable chunks into buckets of at most `capacity` padded
    elements (a chunk larger than it: a bucket of its own), as ColossalAI fills its
    reduce buckets: a chunk that would overflow the open bucket closes it."""
    out, bucket, fill = [], -1, 0
    for c in chunks:
        if c.group < 0:  # frozen: never reduced nor gathered
            out.append(c)
            continue
        if bucket < 0 or fill + c.numel > capacity:
            bucket, fill = bucket + 1, 0
        fill += c.numel
        out.append(Chunk(c.index, c.group, c.numel, c.slots, c.world, bucket))
    return out


def layout_for(
    params: Sequence[tuple[str, torch.Tensor, int]],
    world: int,
    chunk_bytes: int,
    param_dtype: torch.dtype,
    shard_each_param: bool = False,
) -> Layout:
    """The layout shard() builds for a ZeroConfig's chunk_bytes, param_dtype and
    shard_each_param (and what estimate() plans): chunk sizes from chunk_numel_for, and
    with shard_each_param the reduction buckets from bucket_numel_for."""
    element = torch.empty((), dtype=param_dtype).element_size()
    numels = [p.numel() for _, p, _ in params]
    numel = chunk_numel_for(numels, chunk_bytes, element, world)
    bucket = bucket_numel_for(numels, chunk_bytes, element, world) if shard_each_param else 0
    return plan(params, world, numel, shard_each_param, bucket)


def plan(
    params: Sequence[tuple[str, torch.Tensor, int]],
    world: int,
    chunk_numel: int,
    shard_each_param: bool = False,
    bucket_numel: int | None = None,
) -> Layout:
    """params: (name, parameter, param group) in model order.

    shard_each_param: every parameter is a chunk of its own, so each rank's shard
    is its equal slice of every parameter (ColossalAI's LowLevelZero partition,
    which its users read through the optimizer's master parameters). Consecutive
    chunks are grouped into buckets of up to bucket_numel elements (default:
    chunk_numel) whose gradients reduce and whose parameters gather as one collective
    ([Note: coalesced per-parameter shards] in buckets.py); bucket_numel=0: one
    collective per parameter.

    Walking the model in order, each param group keeps one open chunk; a
    parameter that does not fit closes it. Chunks are then numbered by their
    first parameter: close to forward order, and its reverse close to the order
    in which backward finishes them. A chunk is trimmed to what it holds
    (rounded to whole aligned shards), so small models waste no capacity.
    """
    if world < 1:
        raise ValueError(f"world size {world}; expected >= 1")
    align = world * ALIGN_ELEMENTS
    if chunk_numel % align:
        raise ValueError(
            f"chunk of {chunk_numel} elements does not split into {world} aligned shards"
        )
    open_: dict[int, list[Slot]] = {}
    fill: dict[int, int] = {}
    chunks: list[Chunk] = []

    def close(group: int) -> None:
        slots = open_.pop(group)
        used = fill.pop(group)
        chunks.append(
            Chunk(len(chunks), group, min(chunk_numel, round_up(used, align)), tuple(slots), world)
        )

    for index, (name, p, group) in enumerate(params):
        n = p.numel()
        if group in open_ and (
            shard_each_param or round_up(fill[group], ALIGN_ELEMENTS) + n > chunk_numel
        ):
            close(group)
        start = round_up(fill.get(group, 0), ALIGN_ELEMENTS)
        open_.setdefault(group, []).append(Slot(index, name, tuple(p.shape), start))
        fill[group] = start + n
        if n > chunk_numel:
            raise ValueError(
                f"parameter {name!r} has {n} elements, more than a chunk ({chunk_numel}); "
                "raise ZeroConfig.chunk_bytes or leave it 0 to size chunks automatically"
            )
    for group in sorted(open_, key=lambda g: open_[g][0].param):
        close(group)
    chunks.sort(key=lambda c: c.slots[0].param)
    chunks = [Chunk(i, c.group, c.numel, c.slots, world) for i, c in enumerate(chunks)]
    if shard_each_param:
        chunks = _buckets(chunks, chunk_numel if bucket_numel is None else bucket_numel)
    return Layout(world, tuple(chunks), tuple(name for name, _, _ in params))
