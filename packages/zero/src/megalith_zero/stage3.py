"""Stage 3: gather a module's chunks just before it runs (forward and backward), free them after.

Every module that owns parameters directly gets hooks:
- before forward: gather its chunks (waiting for a prefetch already in flight),
  and start gathering the next `prefetch` chunks in the order recorded on the
  first step;
- after forward: drop its hold on the chunks. A chunk nobody holds is released
  when the next module that needs other chunks starts (consecutive modules
  usually share a chunk; releasing at once would gather it again and again);
  While grad mode is on it also hooks the module's outputs, so that the first
  gradient flowing back into them gathers the chunks again for backward.
In backward a chunk is released once all its parameters have their gradient (no
later backward node can read them) or when backward ends.

[Note: kept chunks]
With keep_gathered_bytes, a chunk that forward is done with is not freed but kept
gathered for its use in backward, which then needs no gather. Between forward and
backward every kept chunk's next use is in backward, which reaches the chunks in the
reverse of forward's order, so when the kept bytes exceed the budget the chunk that
forward used earliest (the furthest next use) is freed first: what stays is the tail
of the forward, which backward needs first. A chunk backward is done with is freed as
before: its next use is after the step, which changes its values anyway.

Gathers go through their own process group (a copy of the data-parallel one):
reductions are issued as gradients complete, gathers as autograd reaches
modules, and keeping them apart keeps each group's sequence of collectives the
same on every rank.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

import megalith_comm as comm

from .chunk import FlatChunk
from .streams import Streams


def _gathered_bytes(chunk: FlatChunk) -> int:
    return chunk.full.numel() * chunk.full.element_size()


class Stage3Hooks:
    def __init__(
        self,
        module: torch.nn.Module,
        chunks: list[FlatChunk],
        param_chunk: dict[int, FlatChunk],
        group: comm.ProcessGroup,
        prefetch: int,
        streams: Streams,
        keep_bytes: int = 0,
    ):
        self.group = group
        self.streams = streams
        self.prefetch = prefetch
        #: bytes of gathered chunks kept from forward to backward (see [Note: kept chunks])
        self.keep_bytes = keep_bytes
        self._kept: list[int] = []  # oldest forward use first
        self.chunks = chunks
        self._holds: dict[int, int] = {}
        self._idle: set[int] = set()  # gathered, held by nobody, released at the next other module
        self._last_use: dict[int, int] = {}  # chunk -> when forward last acquired it (this step)
        self._uses = 0
        self._inflight: dict[int, comm.Handle] = {}
        self._order: list[int] = []  # chunk indices in first-use order (first step)
        self._recorded = False
        self._handles = []
        for mod in module.modules():
            own = [p for p in mod._parameters.values() if p is not None]
            mine = sorted({param_chunk[id(p)].spec.index for p in own if id(p) in param_chunk})
            if not mine:
                continue
            self._handles.append(mod.register_forward_pre_hook(self._pre_forward(mine)))
            self._handles.append(mod.register_forward_hook(self._post_forward(mine)))

    def keep_more(self, nbytes: int) -> None:
        """Raises the budget of chunks kept gathered from forward to backward (automatic
        placement gives it the device room its moves left)."""
        self.keep_bytes += nbytes

    # -- gathering ----------------------------------------------------------
    def _start(self, k: int) -> None:
        if k in self._inflight:
            return
        chunk = self.chunks[k]
        with self.streams.on(self.streams.gather):
            handle = chunk.gather(self.group)
        if handle is not None:
            if self.streams.gather is not None:  # freed on the compute stream later
                chunk.full.record_stream(self.streams.gather)
            self._inflight[k] = handle

    def acquire(self, ks: list[int], backward: bool) -> None:
        for k in ks:
            if k in self._kept:
                self._kept.remove(k)
            self._start(k)
        done = [k for k in self._idle - set(ks) if self._holds.get(k, 0) == 0]
        for k in sorted(done, key=lambda j: self._last_use.get(j, -1)):
            self._free_or_keep(k, backward)
        self._idle.clear()
        self._prefetch(ks, backward)
        for k in ks:
            handle = self._inflight.pop(k, None)
            if handle is not None:
                handle.wait()
            self._holds[k] = self._holds.get(k, 0) + 1
            if not backward:
                self._last_use[k] = self._uses
                self._uses += 1
            if not self._recorded and not backward and k not in self._order:
                self._order.append(k)

    def _free_or_keep(self, k: int, backward: bool) -> None:
        """Forward is done with chunk k: keep it gathered for backward while the budget
        allows, freeing the kept chunks with the furthest next use ([Note: kept chunks])."""
        if self.keep_bytes and (backward or torch.is_grad_enabled()):
            self._kept.append(k)
            while sum(_gathered_bytes(self.chunks[j]) for j in self._kept) > self.keep_bytes:
                self._release(self._kept.pop(0))
        else:
            self._release(k)

    def _release(self, k: int) -> None:
        if k not in self._inflight:
            self.chunks[k].release()

    def _prefetch(self, ks: list[int], backward: bool) -> None:
        if not self._recorded or not self.prefetch:
            return
        pos = [self._order.index(k) for k in ks if k in self._order]
        if not pos:
            return
        if backward:
            ahead = self._order[max(0, min(pos) - self.prefetch) : min(pos)][::-1]
        else:
            ahead = self._order[max(pos) + 1 : max(pos) + 1 + self.prefetch]
        for k in ahead:
            self._start(k)

    def release(self, ks: list[int]) -> None:
        for k in ks:
            self._holds[k] -= 1
            if self._holds[k] == 0:
                self._idle.add(k)

    # -- hooks --------------------------------------------------------------
    def _pre_forward(self, ks: list[int]):
        def hook(mod, args):
            self.acquire(ks, backward=False)

        return hook

    def _post_forward(self, ks: list[int]):
        def hook(mod, args, output):
            self.release(ks)
            if torch.is_grad_enabled():
                tensors = [
                    t
                    for t in tree_flatten(output)[0]
                    if isinstance(t, torch.Tensor) and t.requires_grad
                ]
                if tensors:
                    torch.autograd.graph.register_multi_grad_hook(
                        tensors, lambda grads: self.acquire(ks, backward=True), mode="any"
                    )
            return output

        return hook

    def chunk_done(self, chunk: FlatChunk) -> None:
        """All of the chunk's parameters have their gradient: nothing reads them any more."""
        k = chunk.spec.index
        self._holds[k] = 0
        self._idle.discard(k)
        if k not in self._inflight:
            chunk.release()

    def end_step(self) -> None:
        """Backward (or a forward without backward) ended: release everything gathered."""
        self._recorded = self._recorded or bool(self._order)
        for handle in list(self._inflight.values()):
            handle.wait()
        self._inflight.clear()
        self._holds.clear()
        self._idle.clear()
        self._kept.clear()
        self._last_use.clear()
        self._uses = 0
        for c in self.chunks:
            c.release()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
