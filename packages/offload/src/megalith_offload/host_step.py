"""HostStepper: the update of offloaded chunks on the host, pipelined chunk by chunk.

[Note: pipelined host step]
A chunk whose fp32 master and optimizer states live in host memory is updated by the
engine's CPU kernel. Per chunk that is three steps: its reduced gradient shard comes
down (device to host), the kernel updates master and states and writes the new working
parameters into a staging buffer, and those go back up (host to device). One worker
thread runs them for a queue of chunks, so
- the next chunk's gradients come down while the kernel updates this one, and the
  previous chunk's parameters go up meanwhile (separate copy streams on CUDA);
- with ZeroConfig(step_in_backward=True) a chunk is queued as soon as backward has
  reduced its gradients, so the host update of late layers runs while the GPU is still
  computing the backward of early ones, and step() only waits for the tail;
- staging is a ring of a few chunk-sized page-locked buffers (gradients and working
  parameters), not a host copy of the whole model: host memory is what binds offload.

Ordering on CUDA: a chunk's gradient copy waits (on its copy stream) for an event
recorded on the compute stream when the chunk's reduction finished; the host waits
for that copy alone (never for queued compute); the parameter copy goes up on its own
stream, and wait() makes the caller's stream wait for the last of them. Backward never
reads a chunk's parameters again once all of its gradients are in, so writing them
while backward goes on is safe. On CPU ranks the same queue runs with plain copies.
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from megalith_core.memory import StateMemory

from .chunk import OffloadableChunk

#: (host gradients, host working-parameter staging) -> None: the chunk's update
Work = Callable[[torch.Tensor, torch.Tensor], None]


@dataclass
class _Job:
    chunk: OffloadableChunk
    work: Work
    pieces: list[slice]  # shard ranges the work updates (only they go back up)
    ready: torch.cuda.Event | None  # the gradients are reduced (compute stream)
    slot: int = -1
    copied: torch.cuda.Event | None = None
    done: threading.Event = field(default_factory=threading.Event)


class HostStepper:
    def __init__(
        self,
        chunks: list[OffloadableChunk],
        host: StateMemory,
        device: torch.device,
        slots: int = 3,
    ):
        """host: the host arena of the staging; slots: chunk-sized staging buffers of
        each kind (HOST_STEP_SLOTS, which the placement counts); the gradients of up to
        slots - 1 chunks come down while one is updated."""
        self.device = device
        self.slots = slots
        self.cuda = device.type == "cuda"
        numel = self._numel = max(c.spec.shard_numel for c in chunks)
        grad_dtype, self._param_dtype = chunks[0].shard_grad.dtype, chunks[0].shard.dtype
        self._host = host
        self._grads = [host.empty("grad_staging", numel, grad_dtype) for _ in range(self.slots)]
        # chunks whose shard is host memory (param_frac) are updated in place: the
        # parameter staging is made with the first chunk whose shard is on the device
        self._params: list[torch.Tensor | None] = [None] * slots
        self._up_done: list[torch.cuda.Event | None] = [None] * slots
        self._next_slot = 0
        if self.cuda:
            self._down = torch.cuda.Stream(device)
            self._up = torch.cuda.Stream(device)
        self._last_up: torch.cuda.Event | None = None
        #: the host kernel's time and parameters so far (OffloadConfig(visit_frac="auto"))
        self.work_seconds, self.work_numel = 0.0, 0
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._jobs: list[_Job] = []
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # -- caller side ------------------------------------------------------------
    def submit(self, chunk: OffloadableChunk, work: Work, pieces: list[slice]) -> None:
        """Queues the chunk's update; its gradients must be final in stream order now.
        pieces: the shard ranges to copy up afterwards (none: updated in place)."""
        ready = None
        if self.cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        if pieces and self._params[0] is None:
            self._params = [
                self._host.empty("param_staging", self._numel, self._param_dtype)
                for _ in range(self.slots)
            ]
        job = _Job(chunk, work, pieces, ready)
        self._jobs.append(job)
        if self._thread is None:
            self._thread = threading.Thread(
                target=_serve,
                args=(self._queue, weakref.ref(self)),
                name="megalith-host-step",
                daemon=True,
            )
            self._thread.start()
            _LIVE.add(self)
            # a stepper dropped without close() still stops its worker (and frees staging)
            weakref.finalize(self, self._queue.put, None)
        self._queue.put(job)

    def wait(self) -> None:
        """Returns when every queued update is done; on CUDA the caller's current stream
        then waits for the last parameter copy. Re-raises a worker's error."""
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"megalith_offload: the host step failed: {error}") from error
        if self.cuda and self._last_up is not None:
            torch.cuda.current_stream(self.device).wait_event(self._last_up)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    # -- worker side (see _serve) ------------------------------------------------------
    def _start_copy_down(self, job: _Job) -> None:
        job.slot, self._next_slot = self._next_slot, (self._next_slot + 1) % self.slots
        n = job.chunk.spec.shard_numel
        if self._error is not None:
            return
        try:
            grads = self._grads[job.slot][:n]
            if not self.cuda:
                grads.copy_(job.chunk.shard_grad)
                return
            with torch.cuda.stream(self._down):
                self._down.wait_event(job.ready)
                grads.copy_(job.chunk.shard_grad, non_blocking=True)
                job.copied = torch.cuda.Event()
                job.copied.record(self._down)
        except BaseException as e:
            self._error = e

    def _finish(self, job: _Job) -> None:
        try:
            if self._error is None:
                self._step(job)
        except BaseException as e:
            self._error = e
        finally:
            job.done.set()

    def _step(self, job: _Job) -> None:
        n = job.chunk.spec.shard_numel
        grads, staging = self._grads[job.slot][:n], self._params[job.slot]
        params = staging[:n] if staging is not None else job.chunk.shard
        if job.copied is not None:
            job.copied.synchronize()
        if self._up_done[job.slot] is not None:  # the slot's last parameters went up
            self._up_done[job.slot].synchronize()
        start = time.perf_counter()
        job.work(grads, params)
        self.work_seconds += time.perf_counter() - start
        self.work_numel += n
        shard = job.chunk.shard
        if not self.cuda:
            for sl in job.pieces:
                shard[sl].copy_(params[sl])
            return
        with torch.cuda.stream(self._up):
            for sl in job.pieces:
                shard[sl].copy_(params[sl], non_blocking=True)
            up = torch.cuda.Event()
            up.record(self._up)
        self._up_done[job.slot] = self._last_up = up


#: steppers whose worker runs; joined at interpreter exit (see _close_all)
_LIVE: weakref.WeakSet[HostStepper] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """A daemon worker still alive when the interpreter finalizes is stopped inside
    whatever C++ call it is in (Python ends such threads with pthread_exit), which
    aborts the process ("terminate called without an active exception"). Join them
    while the interpreter still runs."""
    for stepper in list(_LIVE):
        stepper.close()


def _serve(jobs: queue.Queue, ref: weakref.ref) -> None:
    """The worker loop of a HostStepper. It holds the stepper only while it has work,
    so that a stepper nobody else holds is freed (its finalizer then stops the loop).
    Gradient copies start for every queued chunk a free slot allows; it blocks for the
    next chunk only when nothing else is in flight."""
    started: collections.deque[_Job] = collections.deque()
    stop = False
    while not (stop and not started):
        if not started:
            job = jobs.get()
            if job is None:
                return
            me = ref()
            if me is None:
                return
            me._start_copy_down(job)
            started.append(job)
        else:
            me = ref()
            if me is None:
                return
        while not stop and len(started) < me.slots - 1:
            try:
                job = jobs.get(block=False)
            except queue.Empty:
                break
            if job is None:
                stop = True
                break
            me._start_copy_down(job)
            started.append(job)
        me._finish(started.popleft())
        # while it waits for more work the loop holds no job: a finished job's closure
        # may hold a chunk's old buffers (automatic placement frees them on a move)
        del me
        job = None
