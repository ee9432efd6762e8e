"""Pinned host memory for asynchronous saves, allocated once per run and reused.

Page-locking memory is slow (torch.empty(pin_memory=True) costs about as much as the
copy into it), so a save must not pin a buffer per tensor. A region is one pinned
buffer per use ("model", "optimizer"), grown only when a save needs more than the
largest one before it; later saves of the same model reuse it and pin nothing.

A region is busy from the save that fills it until the background write that reads it
has finished (release()); the next save into it waits for that first, so a slow disk
never sees its bytes overwritten. Without CUDA the buffers are plain host memory: the
copies into them are the same, only not asynchronous.

A region never pins more than the host can spare (`budget`): by default half of the
memory /proc/meminfo says is available when it grows (plus what it holds already), or
MEGALITH_ASYNC_PINNED_MAX_BYTES. A growth past it, or a pin the system refuses, raises
PinnedBudgetError with the region given back; ZeRO's capture then reads host-resident
state in place instead, or on several ranks writes it synchronously (zero_capture.py).
"""

from __future__ import annotations

import os
import threading

import torch

_ALIGN = 64  # bytes: every tensor taken starts on a cache line (and any dtype's alignment)
ENV = "MEGALITH_ASYNC_PINNED_MAX_BYTES"
#: the share of MemAvailable a region may grow into when ENV is not set
AVAILABLE_SHARE = 0.5


class PinnedBudgetError(RuntimeError):
    """A region could not hold the bytes asked for (over budget, or the pin failed)."""


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def budget(held: int = 0) -> int:
    """The most bytes one region may hold now, given the `held` bytes it has already."""
    text = os.environ.get(ENV)
    if text:
        try:
            return int(float(text))
        except ValueError:
            raise ValueError(f"{ENV}={text!r}: a number of bytes, e.g. 32e9") from None
    available = _mem_available()
    if available is None:  # no /proc/meminfo (not Linux): no cap but the pin's own failure
        return 1 << 62
    return int(AVAILABLE_SHARE * (available + held))


class Region:
    def __init__(self, name: str) -> None:
        self.name = name
        self._buffer: torch.Tensor | None = None
        self._used = 0
        self._free = threading.Event()
        self._free.set()
        #: pinned bytes allocated over the run (a reused region adds nothing)
        self.allocated = 0

    @property
    def held(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def wait_free(self) -> None:
        """Until the last write reading the region is done (acquire waits for it too)."""
        self._free.wait()

    def acquire(self, nbytes: int, limit: int | None = None) -> None:
        """Waits until the last write reading the region is done, then holds nbytes;
        PinnedBudgetError (the region free again) when they are over limit (default
        budget()) or the pin fails."""
        self._free.wait()
        self._free.clear()
        self._used = 0
        if self._buffer is not None and self._buffer.numel() >= nbytes:
            return
        try:
            limit = budget(self.held) if limit is None else limit
            if nbytes > limit:
                raise PinnedBudgetError(
                    f"pinned region {self.name!r}: {size(nbytes)} asked for, over the "
                    f"budget of {size(limit)} ({_why_budget()})"
                )
            self._buffer = None  # the old one goes before the larger one is pinned
            try:
                self._buffer = _pin(max(nbytes, 1))
            except RuntimeError as e:  # torch.AcceleratorError ("out of memory") included
                raise PinnedBudgetError(
                    f"pinned region {self.name!r}: pinning {size(nbytes)} failed: {e}"
                ) from e
        except BaseException:
            self._free.set()
            raise
        self.allocated += nbytes

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat tensor of numel elements out of the held bytes."""
        if self._buffer is None:
            raise RuntimeError("pinned_pool.Region.take before acquire(): acquire the region first")
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        start = -(-self._used // _ALIGN) * _ALIGN
        if start + nbytes > self._buffer.numel():
            raise RuntimeError(
                f"pinned region {self.name!r}: {start + nbytes} bytes taken but "
                f"{self._buffer.numel()} acquired (the save's plan undercounts its tensors)"
            )
        self._used = start + nbytes
        return self._buffer[start : start + nbytes].view(dtype)

    def release(self) -> None:
        """The write that read the region is done (or failed): the next save may fill it."""
        self._free.set()


def size(nbytes: int) -> str:
    """nbytes for a message: GiB, or bytes when that would round to nothing."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 1 << 24 else f"{nbytes} bytes"


def _pin(nbytes: int) -> torch.Tensor:
    """nbytes of page-locked host memory (plain host memory without CUDA)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())


def _why_budget() -> str:
    if os.environ.get(ENV):
        return f"{ENV}"
    return f"{AVAILABLE_SHARE:.0%} of MemAvailable; {ENV} sets it"


def padded(sizes: list[tuple[int, torch.dtype]]) -> int:
    """The bytes Region.take needs for these (numel, dtype) pieces, alignment included."""
    total = 0
    for numel, dtype in sizes:
        total = -(-total // _ALIGN) * _ALIGN + numel * torch.empty((), dtype=dtype).element_size()
    return total


_regions: dict[str, Region] = {}
_lock = threading.Lock()


def region(name: str) -> Region:
    with _lock:
        if name not in _regions:
            _regions[name] = Region(name)
        return _regions[name]
