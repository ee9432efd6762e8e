"""Buckets: the collectives of several one-parameter chunks, each run as one.

[Note: coalesced per-parameter shards]
With ZeroConfig(shard_each_param=True) every parameter is a chunk of its own, so that a
rank's shard of a parameter is its equal slice (ColossalAI's LowLevelZero partition,
which its users read through the optimizer's master parameters). One collective per
parameter pays a latency per parameter (196 of them on a small GPT), so consecutive
chunks up to chunk_bytes form a bucket (layout.plan numbers them; ColossalAI's
reduce_bucket_size) whose gradient reduction and parameter gather are one collective
over a flat buffer laid out rank-major:

    [ c0 shard 0 | c1 shard 0 | ... | c0 shard 1 | c1 shard 1 | ... ]

Rank r's part of a reduce-scatter of that buffer is [c0 shard r | c1 shard r | ...]: its
shard of every chunk, copied from there into each chunk's `shard_grad`. The masters,
optimizer states and steps stay per chunk.

The numbers: a reduce-scatter adds the ranks' copies of an element in an order the
backend picks. At world 2 the order cannot matter (two addends commute), so the reduced
gradients are bit-identical to one collective per chunk. At larger worlds Gloo's order
depends on the rank receiving the element and, for a rare element of a large buffer, on
its position (measured: 1 element of 1.4 M per rank differs at worlds 3 and 4 when the
buffer is offset by 4096), so a coalesced run can differ from a per-parameter one in the
last bit, as the packed layout does (tests/zero/test_coalesced_reduction.py checks
bit-equality at worlds 2 and 3 on a small model, where Gloo's order does not move).
Gloo's all-reduce sums in an order set by position even in small buffers (measured at
worlds 3 and 4), so stage 1 reduce-scatters the bucket and all-gathers the reduced shards back into every chunk's
full gradient: an all-reduce's own two halves, at its bandwidth.

After a step, start_gather packs the bucket's updated shards side by side, all-gathers
them into one rank-major buffer and copies each chunk's rows into its `full`.

The buffers are copies (up to twice a bucket's gradients while it reduces, once its
parameters while it gathers): each chunk's `full` must stay one contiguous run of its
parameter, which the model computes on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

import megalith_comm as comm

from .chunk import FlatChunk


class Reduction(Protocol):
    """The gradient reduction of one or more chunks, reduced as one collective."""

    chunks: list[FlatChunk]

    def start(self, group: comm.ProcessGroup) -> comm.Handle: ...

    def finish(self, handle: comm.Handle, group: comm.ProcessGroup) -> None:
        """Waits for the collective and leaves every chunk's reduced shard in place."""
        ...


class ChunkReduction:
    """A chunk with collectives of its own (the packed layout's chunks)."""

    def __init__(self, chunk: FlatChunk):
        self.chunks = [chunk]

    def start(self, group: comm.ProcessGroup) -> comm.Handle:
        return self.chunks[0].reduce(group)

    def finish(self, handle: comm.Handle, group: comm.ProcessGroup) -> None:
        handle.wait()
        self.chunks[0].finish_reduce()


def _offsets(chunks: Sequence[FlatChunk]) -> tuple[list[int], int]:
    """Where each chunk's shard starts in a rank's part of the bucket, and the part's size."""
    out, n = [], 0
    for c in chunks:
        out.append(n)
        n += c.spec.shard_numel
    return out, n


class GradBucket:
    """Consecutive one-parameter chunks whose gradients reduce as one reduce-scatter."""

    def __init__(self, chunks: list[FlatChunk]):
        self.chunks = chunks
        self.world = chunks[0].spec.world
        self.offsets, self.numel = _offsets(chunks)
        self._work: tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]] | None = None

    def start(self, group: comm.ProcessGroup) -> comm.Handle:
        outs = [c.begin_reduce() for c in self.chunks]
        c0, w, n = self.chunks[0], self.world, self.numel
        packed = c0.memory.empty("grads_in_flight", w * n, c0.reduce_dtype)
        rows = packed.view(w, n)
        for c, o in zip(self.chunks, self.offsets):
            s = c.spec.shard_numel
            rows[:, o : o + s].copy_(c.full_grad.view(w, s))
        reduced = c0.memory.empty("grads_in_flight", n, c0.reduce_dtype)
        self._work = (packed, reduced, outs)
        return comm.reduce_scatter(reduced, packed, op="avg", group=group, async_op=True)

    def finish(self, handle: comm.Handle, group: comm.ProcessGroup) -> None:
        handle.wait()
        if self._work is None:
            raise RuntimeError("GradBucket.finish() without a start(): call start() first")
        packed, reduced, outs = self._work
        self._work = None
        if self.chunks[0].stage == 1:  # every rank keeps the whole reduced gradient
            comm.all_gather(packed, reduced, group=group)
            rows = packed.view(self.world, self.numel)
            for c, o in zip(self.chunks, self.offsets):
                s = c.spec.shard_numel
                c.full_grad.view(self.world, s).copy_(rows[:, o : o + s])
        else:
            for c, o, out in zip(self.chunks, self.offsets, outs):
                out.copy_(reduced[o : o + c.spec.shard_numel])
        for c in self.chunks:
            c.finish_reduce()


def reductions(chunks: list[FlatChunk], world: int) -> list[Reduction]:
    """The reductions of the trainable `chunks` in chunk order: a GradBucket per run of
    chunks in one layout bucket (more than one rank), a ChunkReduction for the others."""
    out: list[Reduction] = []
    run: list[FlatChunk] = []

    def close() -> None:
        if run:
            out.append(GradBucket(list(run)))
            run.clear()

    for c in chunks:
        b = c.spec.bucket
        if b < 0 or world == 1:
            close()
            out.append(ChunkReduction(c))
            continue
        if run and run[-1].spec.bucket != b:
            close()
        run.append(c)
    close()
    return out


def gather_units(chunks: Sequence[FlatChunk]) -> list[list[FlatChunk]]:
    """`chunks` in runs that gather as one collective (one layout bucket each)."""
    out: list[list[FlatChunk]] = []
    for c in chunks:
        b = c.spec.bucket
        if out and b >= 0 and out[-1][-1].spec.bucket == b:
            out[-1].append(c)
        else:
            out.append([c])
    return out


def start_gather(
    chunks: list[FlatChunk], group: comm.ProcessGroup
) -> tuple[comm.Handle, torch.Tensor, Callable[[], None] | None]:
    """Starts all-gathering the updated shards of `chunks` into everyone's `full`:
    (handle, the input to keep alive until it is waited for, what to run after the wait:
    the copies out of the rank-major buffer, None for a single chunk)."""
    if len(chunks) == 1:
        c = chunks[0]
        mine = c.shard.clone()  # the shard is a view of full, the all-gather's output
        return comm.all_gather(c.full, mine, group=group, async_op=True), mine, None
    offsets, n = _offsets(chunks)
    c0, w = chunks[0], chunks[0].spec.world
    mine = torch.empty(n, dtype=c0.full.dtype, device=c0.full.device)
    for c, o in zip(chunks, offsets):
        mine[o : o + c.spec.shard_numel].copy_(c.shard)
    gathered = torch.empty(w * n, dtype=c0.full.dtype, device=c0.full.device)
    handle = comm.all_gather(gathered, mine, group=group, async_op=True)

    def unpack() -> None:
        rows = gathered.view(w, n)
        for c, o in zip(chunks, offsets):
            s = c.spec.shard_numel
            c.full.view(w, s).copy_(rows[:, o : o + s])

    return handle, mine, unpack
