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
first.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

_lock = threading.Lock()
_pending: list[Future] = []
_executor: ThreadPoolExecutor | None = None


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A host copy of t that nothing else holds (a CPU tensor is copied too)."""
    return t.detach().to("cpu", copy=True)


def submit(write: Callable[[], None]) -> None:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="megalith-ckpt")
        _pending.append(_executor.submit(write))


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
    if errors:
        raise RuntimeError(f"an asynchronous checkpoint write failed: {errors[0]}") from errors[0]


atexit.register(lambda: wait() if _pending else None)
