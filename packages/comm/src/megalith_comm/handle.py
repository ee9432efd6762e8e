"""Handle: what an async collective returns; `wait()` finishes it.

A Handle holds the backend's works (torch.distributed Work for Gloo, the engine's
Work for NCCL) and the steps that complete the operation after they finish (copy
results out of staging buffers, divide for "avg"). Failures surface from `wait()`
as CommError naming the rank behind them (health.diagnose).
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from . import health

#: [Note: Gloo works outlive their wait]
#: A Gloo work holds its tensors, and so does the worker thread that ran it, until a moment
#: after wait() returned. When the caller has dropped the tensors by then, the worker's
#: release is the last one, and freeing a tensor made in Python takes the GIL. If the
#: interpreter is finalizing at that moment (the op was among a process's last), the worker
#: is ended inside C++ code that cannot unwind, and the rank aborts at exit with "terminate
#: called without an active exception". So the last few waited works stay referenced here,
#: and are dropped by the main thread: in destroy(), or at exit while the interpreter is
#: still whole.
#: That is not enough when something else holds the Gloo group (torch's DDP keeps its
#: process_group): destroy_process_group() then leaves its worker threads running, and a
#: worker may still hold the last works when the main thread drops them. So destroy()
#: only moves them aside (to be dropped at the next destroy, long after), and at exit
#: they are never freed at all: the process ends with no tensor for a worker to free.
RETIRED_WORKS = 8
_retired: collections.deque[Any] = collections.deque(maxlen=RETIRED_WORKS)
_set_aside: list[Any] = []


def retire(*objects: Any) -> None:
    """Keeps objects a Gloo worker may still reference (works, a synchronous op's tensors)."""
    _retired.extend(objects)


def release_retired() -> None:
    """Sets the kept works aside (megalith_comm.destroy() calls it), dropping those set
    aside by the previous call."""
    _set_aside[:] = list(_retired)
    _retired.clear()


@atexit.register
def _keep_retired_at_exit() -> None:
    kept = [*_set_aside, *_retired]
    if kept:  # one reference that is never released: nothing of these is freed at exit
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))


class StreamWork:
    """The engine's Work, waited for on the caller's current CUDA stream."""

    def __init__(self, work: Any, device: torch.device):
        self._work = work
        self._device = device

    def wait(self) -> None:
        self._work.wait(stream=torch.cuda.current_stream(self._device).cuda_stream)

    def synchronize(self) -> None:
        """Blocks the host until the operation finished (not the caller's stream)."""
        self._work.synchronize()

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())


class EventWork:
    """Work already queued on the caller's CUDA stream (a one-rank group's local copy):
    waiting orders the waiter's current stream after it, like the engine's Work."""

    def __init__(self, device: torch.device):
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(device))
        self._device = device

    def wait(self) -> None:
        torch.cuda.current_stream(self._device).wait_event(self._event)

    def is_completed(self) -> bool:
        return bool(self._event.query())


class Handle:
    """A collective in flight. `wait()` blocks (Gloo) or orders the current stream (NCCL)
    after it, runs its completion steps once, and returns `result`."""

    def __init__(
        self,
        group: Any,
        what: str,
        works: Sequence[Any] = (),
        then: Sequence[Callable[[], None]] = (),
        result: Any = None,
    ):
        self.group = group
        self.what = what
        self._works = list(works)
        self._then = list(then)
        self.result = result
        self._done = False

    @classmethod
    def done(cls, result: Any = None) -> Handle:
        handle = cls(None, "", result=result)
        handle._done = True
        return handle

    @classmethod
    def local(cls, group: Any, device: torch.device) -> Handle:
        """A one-rank group's collective, done by the caller (a copy or nothing). On CUDA
        its work was queued on the caller's current stream, which may be a side stream:
        wait() must order the waiter's stream after it, as for a real collective."""
        if device.type != "cuda":
            return cls.done()
        return cls(group, f"local collective on group {getattr(group, 'name', '')!r}",
                   [EventWork(device)])  # fmt: skip

    def is_completed(self) -> bool:
        return self._done or all(w.is_completed() for w in self._works)

    def wait(self) -> Any:
        if self._done:
            return self.result
        world = self.group.world
        world.blocked = (self.what, time.monotonic())
        try:
            for work in self._works:
                work.wait()
        except RuntimeError as exc:
            self._done = True
            world.blocked = None  # diagnosing, not blocked: the watchdog must let it finish
            raise health.diagnose(world, self.what, exc, self.group) from exc
        finally:
            world.blocked = None
        self._done = True
        _retired.extend(w for w in self._works if isinstance(w, dist.Work))
        for step in self._then:
            step()
        return self.result


def launch(group: Any, what: str, start: Callable[[], Any]) -> Any:
    """Calls start() (which enqueues a backend op), turning a failure into a CommError."""
    try:
        return start()
    except RuntimeError as exc:
        raise health.diagnose(group.world, what, exc, group) from exc


def finish(handle: Handle, async_op: bool) -> Any:
    """The handle for async_op, else waits and returns the handle's result."""
    if async_op:
        return handle
    return handle.wait()
