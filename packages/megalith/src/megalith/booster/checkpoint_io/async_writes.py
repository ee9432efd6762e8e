"""use_async=True: checkpoint files written by a background thread.

The save copies every tensor to host memory first (a snapshot: training may change the
parameters the moment save_model returns), then hands the writing to one writer thread
of the process, so writes land in the order they were asked for. Every file still goes
through megalith_core.atomic_files (temporary name, fsync, rename): a crash mid-write
leaves the previous checkpoint, and an index or optimizer.json is written after the
files it names, so an unfinished save is never taken for a finished one.

The pending writes belong to the process, not to one CheckpointIO object (the Booster
asks its plugin for a new one on each call): `wait()` (CheckpointIO.synchronize) waits
for all of them and raises the first error a write met; every save and load calls it
first. A write that fails stops the queue: the writes after it (the index, the
marker of a finished save, the rename into place) are skipped, so a save that failed
half way is never published; wait() reports it and clears the queue.

The copy is to pinned host memory for CUDA tensors (asynchronous, then one
synchronisation before the writer thread may read), so the step stalls only for the
device-to-host transfer, into pinned regions reused from save to save (pinned_pool.py):
ZeRO's captures copy whole chunks (zero_capture.py), the other plugins' per tensor
(`snapshots`). `snapshot` pins a buffer per tensor: for a one-off copy only.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from . import pinned_pool

_lock = threading.Lock()
_pending: list[Future] = []
_executor: ThreadPoolExecutor | None = None
_failed: list[BaseException] = []  # the first failure of the current queue
_unsettled = False  # copies to pinned memory not yet synchronised


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A host copy of t that nothing else holds (a CPU tensor is copied too); a CUDA
    tensor's lands in pinned memory without waiting (settle() waits)."""
    global _unsettled
    t = t.detach()
    if t.is_cuda:
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t, non_blocking=True)
        _unsettled = True
        return out
    return t.to("cpu", copy=True)


def snapshots(
    region_name: str,
    tensors: Iterable[tuple[str, torch.Tensor]],
    sizes: list[tuple[int, torch.dtype]],
    writer: bool = True,
) -> tuple[list[tuple[str, torch.Tensor]], pinned_pool.Region | None]:
    """Host copies of (key, tensor) pairs in the pinned region `region_name`, which holds
    `sizes` (numel, dtype of each copy, in order); a copy takes the size's dtype (a CUDA
    tensor's copy is asynchronous: settle() waits). ([], None) on a rank that is not the
    writer, which still consumes `tensors` (they may be gathered: collective). The caller
    releases the region once the write that reads the copies is done."""
    global _unsettled
    if not writer:
        for _ in tensors:
            pass
        return [], None
    region = pinned_pool.region(region_name)
    region.acquire(pinned_pool.padded(sizes))
    out = []
    try:
        for (key, t), (numel, dtype) in zip(tensors, sizes, strict=True):
            t = t.detach()
            if t.numel() != numel:
                raise ValueError(f"async save: {key} has {t.numel()} elements but its plan {numel}")
            copy = region.take(numel, dtype).view(t.shape)
            copy.copy_(t, non_blocking=t.is_cuda)
            _unsettled = _unsettled or t.is_cuda
            out.append((key, copy))
    except BaseException:
        region.release()
        raise
    return out, region


def settle() -> None:
    """The snapshots taken so far are complete (the device-to-host copies are done)."""
    global _unsettled
    if _unsettled:
        torch.cuda.synchronize()
        _unsettled = False


def _guarded(write: Callable[[], None], cleanup: Callable[[], None] | None) -> Callable[[], None]:
    def run() -> None:
        try:
            if _failed:
                raise RuntimeError(f"skipped: an earlier checkpoint write failed ({_failed[0]})")
            write()
        except BaseException as e:
            _failed.append(e)
            raise
        finally:
            if cleanup is not None:  # also for a skipped write (it frees what it held)
                cleanup()

    return run


def submit(write: Callable[[], None], cleanup: Callable[[], None] | None = None) -> None:
    """Queues write() on the writer thread; cleanup() runs after it however it ended,
    skipped included (a pinned region or in-place reads it held are given back)."""
    global _executor
    settle()
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="megalith-ckpt")
        _pending.append(_executor.submit(_guarded(write, cleanup)))


def after_pending(write: Callable[[], None]) -> None:
    """write() now when nothing is queued, else queued behind what is (order kept)."""
    if pending():
        submit(write)
    else:
        write()


def pending() -> int:
    with _lock:
        return sum(not f.done() for f in _pending)


def wait() -> None:
    """Waits for every write asked for so far; raises the first one's error."""
    with _lock:
        futures = list(_pending)
        _pending.clear()
    errors = []
    for f in futures:
        try:
            f.result()
        except BaseException as e:  # re-raised below, after all finished
            errors.append(e)
    _failed.clear()
    if errors:
        raise RuntimeError(f"an asynchronous checkpoint write failed: {errors[0]}") from errors[0]


def abandon(error: BaseException) -> BaseException:
    """A save failed before its writes were all queued: waits for the writes already
    queued (their files are removed only once nothing writes them) and returns the
    error to raise: `error` itself, with the fix named; a queued write's own failure is
    only mentioned (it may be a consequence)."""
    later = None
    try:
        wait()
    except RuntimeError as e:
        later = e.__cause__ or e
    also = f" (a write queued before it failed too: {later})" if later is not None else ""
    return RuntimeError(
        f"an asynchronous checkpoint save failed while capturing its state: "
        f"{type(error).__name__}: {error}{also}. Nothing of this save was published; save "
        f"with use_async=False (a synchronous save pins no host memory), or set "
        f"{pinned_pool.ENV} (the bytes one pinned region may hold; under ZeRO host offload "
        f"a lower one reads the host state in place instead of copying it)"
    )


atexit.register(lambda: wait() if _pending else None)
