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

When the optimizer steps in backward (cpu_offload), a region's host state is copied when
all of it fits the pinned budget (pinned_pool.budget: the step then never waits); when
it does not, or the pin fails, all of it is read in place (the 80 GB above), the wait
then happening before the first in-backward update (megalith_zero calls step_pre_hooks
there too), and rank 0 logs how much was read in place.

[Note: gathered host state when the pin fails] On a group of several ranks the writer
has no host chunk of its own to read in place: the files need the other ranks' shards,
which only a collective brings, and a collective cannot wait for the writer thread. So
when the pinned region cannot hold a capture that includes host-offloaded chunks (over
the budget, or the pin refused), the capture gives up on every rank (WriteNow: the
writer's outcome is all-reduced over the group before any gather) and the files are
written synchronously, streamed chunk by chunk as save_full does. Like the single-rank
in-place read it costs no host memory and the training waits for the write (the save
call itself, instead of the next update); rank 0 logs why.
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


class WriteNow(Exception):
    """The capture gave up on every rank of the group ([Note: gathered host state when the
    pin fails]): the caller writes the files synchronously instead."""


class InPlaceReads:
    """The writer reads host tensors in place: zopt's next update (step(), or with
    step_in_backward the first chunk updated in backward) waits until it is done."""

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

    def cancel(self) -> None:
        """No write will read the state (the capture failed): nothing to wait for. On the
        training thread only (the hook list is not changed under a running step)."""
        self.done.set()
        if self._before_step in self.zopt.step_pre_hooks:
            self.zopt.step_pre_hooks.remove(self._before_step)


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


def host_resident(chunk: Any, group_size: int) -> bool:
    """The chunk's state may be read where it lives ([Note: host state read in place])."""
    return group_size == 1 and chunk.tier == "host"


def _gathered(src: torch.Tensor, numel: int, device: torch.device, group: Any) -> torch.Tensor:
    """The full flat tensor of a chunk from every rank's shard; collective."""
    out = torch.empty(numel, dtype=src.dtype, device=device)
    comm.all_gather(out, src.to(device).contiguous(), group=group)
    return out


def _bound(numel: int, dtype: torch.dtype) -> int:
    """Bytes one piece takes in a region at most (its alignment included)."""
    return numel * torch.empty((), dtype=dtype).element_size() + pinned_pool._ALIGN


def _reserve(
    region_name: str,
    sizes: list[tuple[int, torch.dtype]],
    host: list[bool],
    prefer_copy: bool,
    gathered_host: bool = False,
) -> tuple[pinned_pool.Region | None, list[bool]]:
    """The region holding the copies and which pieces are read in place instead: the
    host pieces are copied only with prefer_copy and when all of them fit the region's
    budget (copying part would not shorten the wait: the next update waits until the
    whole write is done). gathered_host: host-offloaded chunks gathered over several
    ranks, which cannot be read in place: WriteNow when the region cannot hold them."""
    region = pinned_pool.region(region_name)
    region.wait_free()
    limit = max(pinned_pool.budget(region.held), region.held)  # a held buffer costs nothing
    fits = prefer_copy and sum(_bound(*z) for z in sizes) <= limit
    in_place = [h and not fits for h in host]
    reason = "the pinned budget"
    for attempt in range(2):
        copied = [z for z, p in zip(sizes, in_place) if not p]
        if not copied:
            return None, in_place
        try:
            region.acquire(pinned_pool.padded(copied), limit)
            break
        except pinned_pool.PinnedBudgetError as e:
            if gathered_host:
                _log_write_now(region_name, e)
                raise WriteNow(str(e)) from e
            if attempt == 1 or not any(host):
                raise RuntimeError(
                    f"asynchronous save: {e}. The device state alone needs more pinned host "
                    f"memory than that: raise {pinned_pool.ENV} if the host has it, or save "
                    "with use_async=False (a synchronous save pins nothing)"
                ) from e
            reason = f"pinning failed ({e})"
            in_place = list(host)
    _log_in_place(region_name, sizes, in_place, prefer_copy, reason, limit)
    return region, in_place


def _log_in_place(
    name: str,
    sizes: list[tuple[int, torch.dtype]],
    in_place: list[bool],
    prefer_copy: bool,
    reason: str,
    limit: int,
) -> None:
    read = sum(_bound(*z) - pinned_pool._ALIGN for z, p in zip(sizes, in_place) if p)
    if not (prefer_copy and read):
        return  # nothing read in place, or in place by design (the next step() waits)
    from megalith.logging import get_dist_logger

    get_dist_logger().warning(
        f"asynchronous save ({name}): {pinned_pool.size(read)} of host-offloaded state read "
        f"in place, not copied: it is over {reason} ({pinned_pool.size(limit)}; "
        f"{pinned_pool.ENV} sets it); the next step waits for the writer before it updates it",
        ranks=[0],
    )


def _log_write_now(name: str, error: pinned_pool.PinnedBudgetError) -> None:
    from megalith.logging import get_dist_logger

    get_dist_logger().warning(
        f"asynchronous save ({name}): written synchronously, chunk by chunk: the "
        f"host-offloaded state gathered over the ranks does not fit pinned memory ({error}; "
        f"{pinned_pool.ENV} sets the budget)",
        ranks=[0],
    )


#: the writer's outcome of reserving its region, all-reduced (max) over the group
_RESERVED, _WRITE_NOW, _FAILED = 0, 1, 2


def _agreed(outcome: int, group: Any) -> int:
    """The worst outcome over the group (the writer's: the others reserve nothing);
    collective, before any gather, so no rank gathers for a capture the writer gave up.
    A host tensor (over the group's Gloo side): reading it back syncs no CUDA stream."""
    flag = torch.tensor([outcome], dtype=torch.int32)
    comm.all_reduce(flag, op="max", group=group)
    return int(flag.item())


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
    host = [host_resident(c, size) for c, _, _ in flats]
    gathered_host = size > 1 and any(c.tier == "host" for c, _, _ in flats)
    in_place = list(host)
    region, outcome, failure = None, _RESERVED, None
    if writer:
        sizes = [(c.spec.numel, dtype) for c, _, dtype in flats]
        prefer_copy = bool(zopt.step_in_backward)
        try:
            region, in_place = _reserve(region_name, sizes, host, prefer_copy, gathered_host)
        except WriteNow as e:
            outcome, failure = _WRITE_NOW, e
        except Exception as e:
            outcome, failure = _FAILED, e
    device = flats[0][0].full.device if flats else torch.device("cpu")
    if size > 1 and flats:
        outcome = _agreed(outcome, group)
    if outcome == _WRITE_NOW:
        raise failure if failure is not None else WriteNow("the writer's region gave up")
    if outcome == _FAILED:
        if failure is not None:
            raise failure
        raise RuntimeError(
            f"asynchronous save ({region_name}): the writing rank could not reserve pinned "
            "memory for it (its own error names the fix)"
        )
    copies = ChunkCopies(region, device)
    out: list[torch.Tensor | None] = []
    try:
        for (c, src_fn, _), here in zip(flats, in_place):
            src = src_fn()
            if here:
                out.append(src if writer else None)
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
    return out, region, writer and any(in_place)


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
    guard = None
    try:
        guard = InPlaceReads(zmodel.optimizer) if writer and read_in_place else None
        persistent = zmodel.module.state_dict(keep_vars=True).keys()
        buffers = {
            n: b.detach().to("cpu", copy=True)
            for n, b in zmodel.module.named_buffers()
            if n in persistent and writer
        }
        plan = [(s.name, s.numel * 4) for c in zmodel.chunks for s in c.spec.slots]
    except BaseException:
        _abandoned(region, guard)  # no write will: the next step must not wait for one
        raise
    done = _once(region, guard)

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
            done()

    write.release = done  # type: ignore[attr-defined]
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
            if c.state_dtype == "fp32":
                flats.append((c, lambda c=c, state=state: c.states[state], torch.float32))
            else:  # lean states go into the files as fp32, decoded into a new tensor
                flats.append((c, lambda c=c, state=state: _decoded(c, state), torch.float32))
            keys.append((c, state))
    hosts, region, read_in_place = flat_sources(flats, zopt.model.group, writer, "optimizer", zopt)
    guard = None
    try:
        guard = InPlaceReads(zopt) if writer and read_in_place else None
        views = []
        for (c, state), flat in zip(keys, hosts):
            if flat is None:
                continue
            for s, step in zip(c.spec.slots, c.steps):
                if step:
                    view = flat[s.offset : s.offset + s.numel].view(s.shape)
                    views.append((f"{s.name}{SEP}{state}", view))
    except BaseException:
        _abandoned(region, guard)
        raise
    return views, _once(region, guard)


def _decoded(chunk: Any, state: str) -> torch.Tensor:
    """A lean-format chunk state as fp32 (megalith_core.optim.flat_states)."""
    from megalith_core.optim import flat_states

    return flat_states.to_fp32(chunk.states)[state]


def _once(region: pinned_pool.Region | None, guard: InPlaceReads | None) -> Callable[[], None]:
    """What gives the region and the in-place reads back once the write is done; it may be
    called again (the write's own finally, then the queue's cleanup) but acts once: a
    second release could free the region under the next save that filled it."""
    lock, todo = threading.Lock(), [region, guard]

    def done() -> None:
        with lock:
            held, todo[:] = list(todo), [None, None]
        if held[0] is not None:
            held[0].release()
        if held[1] is not None:
            held[1].finished()

    return done


def _abandoned(region: pinned_pool.Region | None, guard: InPlaceReads | None) -> None:
    """The capture failed before any write was queued: region and reads given back now."""
    if region is not None:
        region.release()
    if guard is not None:
        guard.cancel()
