"""FileGather: the stage-3 gather of a parameter shard kept in a swap file."""

from __future__ import annotations

import torch

import megalith_comm as comm

from .chunk import OffloadableChunk
from .swap import ParamFiles


class FileGather:
    """The file read starts now (so a prefetch overlaps it with the running module), the
    all-gather into `chunk.full` once the gather is waited for, or its staging buffer is
    needed again ([Note: parameter files] in swap.py); both at the same point of the
    program on every rank, so every rank issues the gather group's collectives in the
    same order. Whoever holds the gather keeps `source`, the shard's device copy the
    all-gather reads, alive."""

    def __init__(self, files: ParamFiles, chunk: OffloadableChunk, group: comm.ProcessGroup):
        self.chunk, self.group = chunk, group
        device = chunk.full.device
        # the caller's stream (stage 3's gather stream), for the copy up and the all-gather
        self.stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.read = files.start_read(chunk.spec.index, holder=self.wait)
        self.source: torch.Tensor | None = None
        self.handle: comm.Handle | None = None
        self.done = False

    def _start_all_gather(self) -> None:
        if self.handle is not None:
            return
        src = self.read.wait()
        full = self.chunk.full
        if self.stream is None:  # CPU ranks: the all-gather reads the staging buffer itself
            self.handle = comm.all_gather(full, src, group=self.group, async_op=True)
            return
        with torch.cuda.stream(self.stream):
            src = self.source = src.to(full.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.stream)
            self.handle = comm.all_gather(full, src, group=self.group, async_op=True)
        self.read.release(copied)  # the buffer is free once the copy up is done

    def wait(self) -> None:
        if self.done:
            return
        self._start_all_gather()
        self.handle.wait()
        self.done = True
        if self.stream is None:
            self.read.release()
