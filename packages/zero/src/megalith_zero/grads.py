"""GradReducer: gradients from autograd into chunk buffers, reduced as chunks fill.

Each trainable parameter gets a post-accumulate-grad hook: its gradient is added
to its chunk's full_grad and `param.grad` dropped. A chunk is reduced (stage 1:
all-reduce, stages 2/3: reduce-scatter) once every one of its parameters has
delivered this backward, asynchronously, so communication runs while backward
goes on. [Note: reduce order] Chunks are reduced strictly in descending index
order (the order backward fills them in), and whatever has not gone when backward
ends goes then, in the same order: every rank issues the same collectives in the
same order even when different ranks leave different parameters unused.

[Note: local accumulation] Inside no_sync() a chunk's full-size gradient buffer stays
until the first synchronised backward reduces it. On one rank at stage 2 or 3 that
buffer only doubles the shard's (gradient accumulation at world 1 would hold twice the
model's gradients on the device): there the reduction, a local move into the shard, runs
under no_sync too, so micro-batches accumulate into the shard. Such a backward still
counts as not synchronised (no chunk is reported reduced: nothing is updated in it).

With shard_each_param the unit of reduction is a bucket of consecutive one-parameter
chunks, reduced as one collective once all of its chunks are complete ([Note: coalesced
per-parameter shards] in buckets.py); the order above holds for buckets.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

import megalith_comm as comm

from .buckets import Reduction, reductions
from .chunk import FlatChunk
from .streams import Streams

#: reductions (chunks or buckets) left running while backward goes on; older ones are
#: finished first.
MAX_IN_FLIGHT = 2


class GradReducer:
    def __init__(
        self,
        chunks: list[FlatChunk],
        group: comm.ProcessGroup,
        overlap: bool,
        streams: Streams,
        on_chunk_done: Callable[[FlatChunk], None] | None = None,
        on_backward_end: Callable[[], None] | None = None,
    ):
        #: called with each chunk once its reduction is finished (in stream order on
        #: CUDA); ZeroOptimizer steps offloaded chunks from here during backward
        self.on_reduced: Callable[[FlatChunk], None] | None = None
        #: called at the first gradient of each backward, before any reduction
        self.on_backward_start: Callable[[], None] | None = None
        #: backward passes that reduced (not inside no_sync) so far
        self.synced_backwards = 0
        self.chunks = [c for c in chunks if c.trainable]
        self.group = group
        self.overlap = overlap
        self.streams = streams
        self.on_chunk_done = on_chunk_done  # stage 3 releases gathered params here
        self.on_backward_end = on_backward_end
        self.sync = True
        #: reduce inside no_sync too ([Note: local accumulation])
        self._local = group.size == 1 and all(c.stage != 1 for c in self.chunks)
        #: what is reduced as one collective, in chunk order (see buckets.py)
        self.units: list[Reduction] = reductions(self.chunks, group.size)
        #: the position in self.chunks of each unit's first chunk
        self._first = [0]
        for unit in self.units[:-1]:
            self._first.append(self._first[-1] + len(unit.chunks))
        self._next = len(self.units) - 1
        self._pending: list[tuple[Reduction, comm.Handle]] = []
        self._arrived = [0] * len(self.chunks)
        self._in_backward = False
        self._hooks = []
        for k, c in enumerate(self.chunks):
            for i, p in enumerate(c.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._hook(k, i)))

    def _hook(self, k: int, i: int) -> Callable[[torch.Tensor], None]:
        # The hook lives on the parameter, which views chunk memory that this reducer
        # holds; a strong reference would close a cycle through C++ that Python's
        # collector cannot see, and every chunk would outlive the model.
        me = weakref.ref(self)

        def on_grad(p: torch.Tensor) -> None:
            self = me()
            if self is None:
                return
            if not self._in_backward:
                if self.sync and self.on_backward_start is not None:
                    self.on_backward_start()
                self._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            chunk = self.chunks[k]
            with torch.no_grad():
                chunk.add_grad(i, p.grad)
            p.grad = None
            self._arrived[k] += 1
            if self._arrived[k] == len(chunk.params):
                if self.on_chunk_done is not None:
                    self.on_chunk_done(chunk)
                if (self.sync or self._local) and self.overlap:
                    self._launch(until_complete=True)

        return on_grad

    def _complete(self, u: int) -> bool:
        """Every parameter of unit u has delivered its gradient this backward."""
        first = self._first[u]
        return all(
            self._arrived[first + j] == len(c.params) for j, c in enumerate(self.units[u].chunks)
        )

    def _launch(self, until_complete: bool) -> None:
        while self._next >= 0:
            if until_complete and not self._complete(self._next):
                return
            unit = self.units[self._next]
            with self.streams.on(self.streams.reduce):
                handle = unit.start(self.group)
            self._pending.append((unit, handle))
            self._next -= 1
            # Finish all but the newest few so their full-size gradient buffers go
            # back while backward continues (stages 2 and 3 keep only shards).
            while len(self._pending) > MAX_IN_FLIGHT:
                done, handle = self._pending.pop(0)
                self._finish(done, handle)

    def _end_backward(self) -> None:
        self._in_backward = False
        if self.sync or self._local:
            self._launch(until_complete=False)
            self.wait()
        if self.sync:
            self.synced_backwards += 1
        self._next = len(self.units) - 1
        self._arrived = [0] * len(self.chunks)
        if self.on_backward_end is not None:
            self.on_backward_end()

    def wait(self) -> None:
        pending, self._pending = self._pending, []
        for unit, handle in pending:
            self._finish(unit, handle)

    def _finish(self, unit: Reduction, handle: comm.Handle) -> None:
        unit.finish(handle, self.group)
        if self.on_reduced is not None and self.sync:
            for c in unit.chunks:
                self.on_reduced(c)

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
