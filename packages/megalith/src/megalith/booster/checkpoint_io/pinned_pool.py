"""Pinned host memory for asynchronous saves, allocated once per run and reused.

Page-locking memory is slow (torch.empty(pin_memory=True) costs about as much as the
copy into it), so a save must not pin a buffer per tensor. A region is one pinned
buffer per use ("model", "optimizer"), grown only when a save needs more than the
largest one before it; later saves of the same model reuse it and pin nothing.

A region is busy from the save that fills it until the background write that reads it
has finished (release()); the next save into it waits for that first, so a slow disk
never sees its bytes overwritten. Without CUDA the buffers are plain host memory: the
copies into them are the same, only not asynchronous.
"""

from __future__ import annotations

import threading

import torch

_ALIGN = 64  # bytes: every tensor taken starts on a cache line (and any dtype's alignment)


class Region:
    def __init__(self, name: str) -> None:
        self.name = name
        self._buffer: torch.Tensor | None = None
        self._used = 0
        self._free = threading.Event()
        self._free.set()
        #: pinned bytes allocated over the run (a reused region adds nothing)
        self.allocated = 0

    def acquire(self, nbytes: int) -> None:
        """Waits until the last write reading the region is done, then holds nbytes."""
        self._free.wait()
        self._free.clear()
        self._used = 0
        if self._buffer is None or self._buffer.numel() < nbytes:
            self._buffer = None  # the old one goes before the larger one is pinned
            pin = torch.cuda.is_available()
            self._buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pin)
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
