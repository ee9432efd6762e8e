"""use_async under ZeRO: the step stalls only for the device-to-host copy of the chunks.

megalith_zero keeps each chunk's master, optimizer states (and a frozen chunk's
parameters) as one flat tensor, so a capture copies whole chunks, not parameters:
one copy per chunk and state, issued on a side CUDA stream into a pinned region
(pinned_pool.py, allocated by the first save and reused) and waited for once at the
end. On a group of several ranks each chunk is all-gathered first (collective) and
only the writer keeps a host copy. The per-parameter views, the dtype conversions,
the safetensors headers, the checksums, the file writes and the fsyncs all happen
later on the writer thread (async_writes).

[Note: host state read in place] A chunk whose master and states already live in host
memory (offloaded to the "host" tier) on a group of one rank is not copied at all: the
writer reads those tensors where they are. They must not change under it, so the
optimizer's next step() waits until the write has read them (a step pre-hook; see
InPlaceReads). We chose the wait over copy-on-write: it costs no memory (an offloaded
6.7B's state is 80 GB, more than the host could copy) and nothing before the next step,
which only waits when the files are still being written when it starts; the time it
waited is recorded in `last_step_wait_s`. On a group of several ranks a host chunk is
gathered like any other (the writer needs the other ranks' shards).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import megalith_comm as comm
from megalith_core.safetensors_files import StreamedFiles, atomic_save

from . import pinned_pool

#: seconds the last step() after a save waited for the writer's in-place reads
last_step_wait_s = 0.0
#: bytes of gathered device temporaries in flight before the copies are waited for
_INFLIGHT_BYTES = 2 << 30


class InPlaceReads:
    """The writer reads host tensors in place: zopt's next step() waits until it is done."""

    def __init__(self, zopt: Any) -> None:
        self.done = threading.Event()
        self.zopt = zopt
        zopt.step_pre_hooks.append(self._before_step)

    def _before_step(self) -> None:
        global last_step_wait_s
        start = time.perf_counter()
        self.done.wait()
        last_step_wait_s = time.perf_counter() - start
        self.zopt.step_pre_hooks.remove(self._before_step)

    def finished(self) -> None:
        self.done.set()


class ChunkCopies:
    """Flat copies into a pinned region, on a side stream for device tensors."""

    def __init__(self, region: pinned_pool.Region | None, device: torch.device) -> None:
        self.region = region
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._inflight = 0

    def copy(self, src: torch.Tensor, temporary: bool = False) -> torch.Tensor:
        if self.region is None:
            raise RuntimeError(
                "zero_capture: copy() needs a pinned region; this capture was made without one"
            )
        dst = self.region.take(src.numel(), src.dtype)
        if self.stream is None or not src.is_cuda:
            dst.copy_(src)
            return dst
        self.stream.wait_stream(torch.cuda.current_stream(src.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        if temporary:  # a gathered chunk: its memory is reused only after the copy
            src.record_stream(self.stream)
            self._inflight += src.numel() * src.element_size()
            if self._inflight > _INFLIGHT_BYTES:
                self.settle()
        return dst

    def settle(self) -> None:
        """Every copy issued so far has landed."""
        if self.stream is not None:
            self.stream.synchronize()
        self._inflight = 0


def in_place(chunk: Any, group_size: int, zopt: Any) -> bool:
    """The chunk's state is read where it lives ([Note: host state read in place]); not
    when the optimizer updates chunks during backward (before step()'s pre-hook)."""
    return group_size == 1 and chunk.tier == "host" and not zopt.step_in_backward


def _gathered(src: torch.Tensor, numel: int, device: torch.device, group: Any) -> torch.Tensor:
    """The full flat tensor of a chunk from every rank's shard; collective."""
    out = torch.empty(numel, dtype=src.dtype, device=device)
    comm.all_gather(out, src.to(device).contiguous(), group=group)
    return out


def flat_sources(
    flats: list[tuple[Any, Callable[[], torch.Tensor], torch.dtype]],
    group: Any,
    writer: bool,
    region_name: str,
    zopt: Any,
) -> tuple[list[torch.Tensor | None], pinned_pool.Region | None, bool]:
    """For each (chunk, shard source, its dtype): the host flat tensor the writer will read (None on
    other ranks), the pinned region that holds the copies (to release after the write)
    and whether any were read in place. Collective over group."""
    size = group.size
    copied = [(c.spec.numel, dtype) for c, _, dtype in flats if not in_place(c, size, zopt)]
    region = None
    if writer and copied:
        region = pinned_pool.region(region_name)
        region.acquire(pinned_pool.padded(copied))
    device = flats[0][0].full.device if flats else torch.device("cpu")
    copies = ChunkCopies(region, device)
    out: list[torch.Tensor | None] = []
    any_in_place = False
    try:
        for c, src_fn, _ in flats:
            src = src_fn()
            if in_place(c, size, zopt):
                out.append(src if writer else None)
                any_in_place = True
            elif size == 1:
                out.append(copies.copy(src))
            else:
                full = _gathered(src, c.spec.numel, device, group)
                out.append(copies.copy(full, temporary=True) if writer else None)
        copies.settle()
    except BaseException:
        if region is not None:
            region.release()
        raise
    return out, region, any_in_place


def capture_params(zmodel: Any, writer: bool) -> Callable[[Path, int], None]:
    """The model's files (save_full's, identity layout) from flat host copies of every
    chunk's fp32 master (a frozen chunk's parameters); collective."""
    flats = [
        (c, c.master_values, torch.float32)
        if c.trainable
        else (c, lambda c=c: c.shard, c.param_dtype)
        for c in zmodel.chunks
    ]
    hosts, region, read_in_place = flat_sources(
        flats, zmodel.group, writer, "model", zmodel.optimizer
    )
    guard = InPlaceReads(zmodel.optimizer) if writer and read_in_place else None
    persistent = zmodel.module.state_dict(keep_vars=True).keys()
    buffers = {
        n: b.detach().to("cpu", copy=True)
        for n, b in zmodel.module.named_buffers()
        if n in persistent and writer
    }
    plan = [(s.name, s.numel * 4) for c in zmodel.chunks for s in c.spec.slots]

    def write(directory: Path, cap: int) -> None:
        try:
            out = StreamedFiles(directory, "model", plan, cap, write=writer)
            for c, flat in zip(zmodel.chunks, hosts):
                for s in c.spec.slots:
                    if flat is not None:
                        out.add(s.name, flat[s.offset : s.offset + s.numel].view(s.shape).float())
            if writer and buffers:
                atomic_save(buffers, directory / "buffers.safetensors", metadata={"format": "pt"})
            out.finish({n: "buffers.safetensors" for n in buffers} if writer else {})
        finally:
            _done(region, guard)

    write.release = lambda: _done(region, guard)  # type: ignore[attr-defined]
    return write


def capture_states(zopt: Any, writer: bool) -> tuple[list[tuple[str, torch.Tensor]], Callable]:
    """(key, host view) of every full optimizer state in full_plan's order, and what to
    call once the write has read them; collective (inside resident_states)."""
    from megalith_core.optimizer_files import SEP

    groups = zopt.optimizer.param_groups
    flats, keys = [], []
    for c in zopt.trainable:
        if not any(c.steps):
            continue
        names = zopt.rule.state_names(groups[c.spec.group])
        c.ensure_states(names)
        for state in names:
            flats.append((c, lambda c=c, state=state: c.states[state], torch.float32))
            keys.append((c, state))
    hosts, region, read_in_place = flat_sources(flats, zopt.model.group, writer, "optimizer", zopt)
    guard = InPlaceReads(zopt) if writer and read_in_place else None
    views = []
    for (c, state), flat in zip(keys, hosts):
        if flat is None:
            continue
        for s, step in zip(c.spec.slots, c.steps):
            if step:
                view = flat[s.offset : s.offset + s.numel].view(s.shape)
                views.append((f"{s.name}{SEP}{state}", view))
    return views, lambda: _done(region, guard)


def _done(region: pinned_pool.Region | None, guard: InPlaceReads | None) -> None:
    if region is not None:
        region.release()
    if guard is not None:
        guard.finished()
