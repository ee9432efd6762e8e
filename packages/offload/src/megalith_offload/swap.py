"""NVMe tier: each offloaded chunk's optimizer states in one file of a per-run swap
directory (the engine's SwapDir), staged through 4096-aligned host buffers so the
engine's async I/O takes its O_DIRECT path.

A file holds the chunk's states one after the other, each padded to 4096 bytes; a
whole file moves in one request. stream() hands chunks out one at a time: the next
chunk's read is in flight while the caller steps the current one, and each chunk's
write-back starts as soon as the caller is done with it.

[Note: parameter files] With param_tier="nvme" a chunk's working-parameter shard has
a file of its own (ParamFiles), not a section of the states' file: it exists from the
start (the states' names are known only at the first step), a stage-3 gather reads
just the shard, not the states, and the two kinds are accounted apart. It moves
through a ring of PARAM_SWAP_SLOTS staging buffers: a gather holds a buffer from its
read until its all-gather has consumed it; taking a held buffer first finishes its
holder's gather (at the same point of the program on every rank, so every rank still
issues its collectives in the same order).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Hashable, Iterable, Iterator

import torch

from megalith_core import _engine
from megalith_core.memory import HOST_ALIGNMENT as ALIGNMENT
from megalith_core.memory import StateMemory
from megalith_core.optim import flat_states

from .config import OffloadConfig
from .placement import padded

FLOAT = 4  # states are fp32
#: the name of a chunk's fp32 master in its file (OffloadConfig.master_tier="nvme"),
#: ahead of the optimizer states
MASTER = "master"


def _padded(numel: int) -> int:
    nbytes = numel * FLOAT
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def file_bytes(numel: int, n_states: int) -> int:
    """Bytes of the swap file (and staging buffer) for n_states fp32 vectors of numel."""
    return n_states * _padded(numel)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def _layout(
    names: tuple[str, ...], numel: int, state_dtype: str
) -> list[tuple[str, torch.dtype, int, int]]:
    """(name, dtype, elements, byte offset) of each vector of a file: the stored vectors
    of `names` in `state_dtype` (lean states: megalith_core.optim.flat_states; the
    master and fp32 states are fp32 vectors), each starting on a 4096-byte boundary."""
    out, offset = [], 0
    for n, (dtype, count) in flat_states.specs(names, state_dtype, numel).items():
        out.append((n, dtype, count, offset))
        offset += _aligned(count * torch.empty((), dtype=dtype).element_size())
    return out


def lean_file_bytes(names: tuple[str, ...], numel: int, state_dtype: str) -> int:
    """Bytes of the swap file of states `names` (and MASTER) in `state_dtype`."""
    return sum(
        _aligned(count * torch.empty((), dtype=dtype).element_size())
        for _, dtype, count, _ in _layout(names, numel, state_dtype)
    )


def _reserve(
    swap_dir: _engine.io.SwapDir, name: str, nbytes: int, staging: int, what: str
) -> _engine.io.SwapFile:
    """A swap file of `nbytes` for `what`, which must fit its `staging` buffer; a full
    disk raises OSError naming what, the bytes and the directory."""
    if nbytes > staging:
        raise ValueError(
            f"megalith_offload: {what}: {nbytes} bytes, more than the "
            f"{staging}-byte staging buffer planned for it"
        )
    try:
        return swap_dir.allocate(name, nbytes)
    except OSError as e:
        raise OSError(
            e.errno,
            f"megalith_offload: no room for {what} ({nbytes} bytes) "
            f"in the swap directory {swap_dir.path}: {e}",
        ) from e


class _Entry:
    def __init__(
        self, file: _engine.io.SwapFile, names: tuple[str, ...], numel: int, state_dtype: str
    ):
        self.file, self.names, self.numel, self.state_dtype = file, names, numel, state_dtype
        self.vectors = _layout(names, numel, state_dtype)
        self.fresh = True  # never written: starts as zeros without a read


class _Slot:
    def __init__(self, buf: torch.Tensor):
        self.buf = buf  # fp32 view of a 4096-aligned host buffer
        self.pending: list[_engine.io.Request] = []

    def settle(self) -> None:
        reqs, self.pending = self.pending, []
        for r in reqs:
            r.wait()


class SwapStore:
    """Named fp32 state vectors per key (a chunk), kept in files on NVMe (with
    master_tier="nvme" the chunk's master first, named MASTER); with param_slots, also
    parameter shards in files of their own (`params`)."""

    MASTER = MASTER

    def __init__(
        self,
        config: OffloadConfig,
        rank: int,
        host: StateMemory,
        slots: int,
        slot_bytes: int,
        param_slots: int = 0,
        param_slot_bytes: int = 0,
    ):
        root = config.swap_dir or tempfile.gettempdir()
        os.makedirs(root, exist_ok=True)
        self.io = _engine.io.AsyncIO(
            threads=config.io_threads, direct=config.direct, backend=config.io_backend
        )
        self.dir = _engine.io.SwapDir(root, f"{config.run_name}-rank{rank}", self.io)
        self.path: str = self.dir.path
        self._entries: dict[Hashable, _Entry] = {}
        self._slots = [_Slot(host.empty("swap_staging", slot_bytes // FLOAT)) for _ in range(slots)]
        self._peak = self._master_peak = 0  # file bytes, and the masters' part of them
        #: reads started while the caller still held the previous chunk (the overlap)
        self.prefetched = 0
        #: parameter shards on NVMe (param_tier="nvme"), or None
        self.params: ParamFiles | None = None
        if param_slots:
            self.params = ParamFiles(self.dir, host, param_slots, param_slot_bytes)

    @property
    def overlapped(self) -> bool:
        return len(self._slots) > 1

    def ensure(
        self, key: Hashable, names: tuple[str, ...], numel: int, state_dtype: str = "fp32"
    ) -> None:
        """Reserves the file for `key`'s states on disk (zeros until first written);
        state_dtype: their format (lean states keep their bf16 or int8 bytes on disk)."""
        entry = self._entries.get(key)
        if entry is not None:
            if (entry.names, entry.numel, entry.state_dtype) != (names, numel, state_dtype):
                raise ValueError(
                    f"megalith_offload: chunk {key} has states {entry.names} of {entry.numel} "
                    f"elements ({entry.state_dtype}) on NVMe; asked for {names} of {numel} "
                    f"({state_dtype})"
                )
            return
        nbytes = lean_file_bytes(names, numel, state_dtype)
        staging = self._slots[0].buf.numel() * FLOAT
        file = _reserve(self.dir, f"chunk{key}", nbytes, staging, f"chunk {key}'s optimizer states")
        self._entries[key] = _Entry(file, names, numel, state_dtype)
        self._note_peak()

    def _note_peak(self) -> None:
        if self.nbytes >= self._peak:
            self._peak, self._master_peak = self.nbytes, self.master_bytes

    def _views(self, entry: _Entry, slot: _Slot) -> dict[str, torch.Tensor]:
        raw = slot.buf.view(torch.uint8)
        return {
            n: raw[off : off + count * torch.empty((), dtype=dtype).element_size()].view(dtype)
            for n, dtype, count, off in entry.vectors
        }

    def _whole(self, entry: _Entry, slot: _Slot) -> torch.Tensor:
        return slot.buf[: entry.file.nbytes // FLOAT]

    def _start_read(self, key: Hashable, slot: _Slot) -> _engine.io.Request | None:
        slot.settle()  # its last chunk's write-back must finish before the buffer is reused
        entry = self._entries[key]
        if entry.fresh:
            self._whole(entry, slot).zero_()
            return None
        return entry.file.read(self._whole(entry, slot))

    def stream(
        self, keys: Iterable[Hashable], write: bool = True
    ) -> Iterator[tuple[Hashable, dict[str, torch.Tensor]]]:
        """Yields (key, states) with the states in host memory; what the caller changes
        is written back (write=False: not, for a caller that only reads). The next
        key's read overlaps the caller's work on this one."""
        keys = list(keys)
        if not keys:
            return
        n = len(self._slots)
        reads = {0: self._start_read(keys[0], self._slots[0])}
        try:
            for i, key in enumerate(keys):
                slot = self._slots[i % n]
                req = reads.pop(i)
                if req is not None:
                    req.wait()
                if n > 1 and i + 1 < len(keys):
                    reads[i + 1] = self._start_read(keys[i + 1], self._slots[(i + 1) % n])
                    self.prefetched += reads[i + 1] is not None
                entry = self._entries[key]
                yield key, self._views(entry, slot)
                if write:
                    slot.pending.append(entry.file.write(self._whole(entry, slot)))
                    entry.fresh = False
                if n == 1 and i + 1 < len(keys):
                    reads[i + 1] = self._start_read(keys[i + 1], slot)
        finally:
            for r in reads.values():
                if r is not None:
                    r.wait()
            for s in self._slots:
                s.settle()

    def load(self, key: Hashable, out: dict[str, torch.Tensor]) -> None:
        """Copies `key`'s vectors named in `out` (all or some) into it, synchronously."""
        for _, states in self.stream([key], write=False):
            for name, t in out.items():
                t.copy_(states[name])

    def store(self, key: Hashable, src: dict[str, torch.Tensor]) -> None:
        """Replaces `key`'s vectors named in `src` (all or some), synchronously; the
        others keep their values (zeros in a file never written)."""
        for _, states in self.stream([key]):
            for name, t in src.items():
                states[name].copy_(t)

    def has(self, key: Hashable) -> bool:
        return key in self._entries

    def drop(self, key: Hashable) -> None:
        """Forgets `key`'s states (moved elsewhere): its file is truncated to 0 bytes,
        freeing the disk space, and removed with the directory."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        for s in self._slots:
            s.settle()  # a write-back to this file may still be in flight
        os.truncate(entry.file.path, 0)

    @property
    def nbytes(self) -> int:
        return sum(e.file.nbytes for e in self._entries.values())

    @property
    def master_bytes(self) -> int:
        """Bytes of the files' master sections (OffloadConfig.master_tier="nvme")."""
        return sum(_padded(e.numel) for e in self._entries.values() if MASTER in e.names)

    def report(self) -> dict[str, tuple[int, int]]:
        masters = self.master_bytes
        out = {"optim_states@nvme": (self.nbytes - masters, self._peak - self._master_peak)}
        if masters or self._master_peak:
            out["master@nvme"] = (masters, self._master_peak)
        if self.params is not None:
            out["params@nvme"] = (self.params.nbytes, self.params.nbytes)
        return out

    def reset_peak(self) -> None:
        self._peak, self._master_peak = self.nbytes, self.master_bytes

    def close(self) -> None:
        """Waits for every transfer and deletes the swap directory and its files."""
        for s in self._slots:
            s.settle()
        if self.params is not None:
            self.params.settle()
        self._entries.clear()
        self.dir.remove()


class _ParamSlot:
    def __init__(self, buf: torch.Tensor):
        self.buf = buf  # bytes of a 4096-aligned host buffer
        self.pending: list[_engine.io.Request] = []  # write-backs from it
        #: finishes the gather that still reads from the buffer (see [Note: parameter files])
        self.holder: Callable[[], None] | None = None
        #: a CUDA event: the copy up from the buffer is done (None: nothing in flight)
        self.used_until: torch.cuda.Event | None = None

    def settle(self) -> None:
        holder, self.holder = self.holder, None
        if holder is not None:
            holder()  # done with the buffer when it returns
        reqs, self.pending = self.pending, []
        for r in reqs:
            r.wait()
        if self.used_until is not None:
            self.used_until.synchronize()
            self.used_until = None


class ParamRead:
    """A parameter shard being read into a staging buffer; the buffer is the caller's
    until release()."""

    def __init__(self, view: torch.Tensor, slot: _ParamSlot, request: _engine.io.Request):
        self.view, self._slot, self._request = view, slot, request

    def wait(self) -> torch.Tensor:
        """The shard's values (a view of the staging buffer), once read."""
        if self._request is not None:
            self._request.wait()
            self._request = None
        return self.view

    def release(self, used_until: torch.cuda.Event | None = None) -> None:
        """The buffer is free again (on CUDA once `used_until` has happened)."""
        self.wait()
        self._slot.holder = None
        self._slot.used_until = used_until


class ParamFiles:
    """Working-parameter shards per key (a chunk), one file each in the swap directory,
    moved through a ring of host staging buffers ([Note: parameter files])."""

    def __init__(
        self, swap_dir: _engine.io.SwapDir, host: StateMemory, slots: int, slot_bytes: int
    ):
        self.dir = swap_dir
        self._files: dict[Hashable, tuple[_engine.io.SwapFile, int, torch.dtype]] = {}
        self._slots = [
            _ParamSlot(host.empty("param_swap_staging", slot_bytes, torch.uint8))
            for _ in range(slots)
        ]
        self._next = 0
        #: the write-back in flight per key: a read or write of that file waits for it
        #: (requests on one file must not overlap, and a read must see the last write)
        self._writing: dict[Hashable, _engine.io.Request] = {}

    def ensure(self, key: Hashable, numel: int, dtype: torch.dtype) -> None:
        """Reserves the file for `key`'s shard of `numel` elements of `dtype`."""
        if key in self._files:
            return
        nbytes = padded(numel * torch.empty((), dtype=dtype).element_size())
        staging = self._slots[0].buf.numel()
        what = f"chunk {key}'s parameter shard"
        file = _reserve(self.dir, f"chunk{key}.params", nbytes, staging, what)
        self._files[key] = (file, numel, dtype)

    def _take(self) -> _ParamSlot:
        slot, self._next = self._slots[self._next], (self._next + 1) % len(self._slots)
        slot.settle()
        return slot

    def _file(self, key: Hashable) -> _engine.io.SwapFile:
        """`key`'s file, once no write-back to it is in flight."""
        write = self._writing.pop(key, None)
        if write is not None:
            write.wait()
        return self._files[key][0]

    def _view(self, key: Hashable, slot: _ParamSlot) -> torch.Tensor:
        file, numel, dtype = self._files[key]
        return slot.buf[: file.nbytes].view(dtype)[:numel]

    def start_read(self, key: Hashable, holder: Callable[[], None] | None = None) -> ParamRead:
        """Starts reading `key`'s shard into a staging buffer. `holder` finishes whatever
        the caller does with it, should the ring need the buffer back first."""
        slot = self._take()
        file = self._file(key)
        request = file.read(slot.buf[: file.nbytes])
        slot.holder = holder
        return ParamRead(self._view(key, slot), slot, request)

    @contextlib.contextmanager
    def staged(self, key: Hashable, read: bool = True) -> Iterator[torch.Tensor]:
        """The shard in a staging buffer (read=False: not read, for a caller that
        overwrites all of it); written back, asynchronously, on a clean exit."""
        slot = self._take()
        file = self._file(key)
        if read:
            file.read(slot.buf[: file.nbytes]).wait()
        yield self._view(key, slot)
        write = file.write(slot.buf[: file.nbytes])
        slot.pending.append(write)
        self._writing[key] = write

    def load(self, key: Hashable) -> torch.Tensor:
        """`key`'s shard as a new host tensor (pageable), synchronously."""
        with self.staged(key) as view:
            out = view.clone()
        return out

    def store(self, key: Hashable, src: torch.Tensor) -> None:
        """Replaces `key`'s shard with `src` (any device), synchronously."""
        slot = self._take()
        file = self._file(key)
        self._view(key, slot).copy_(src)
        file.write(slot.buf[: file.nbytes]).wait()

    def settle(self) -> None:
        """Waits for every transfer (finishing any gather still reading a buffer)."""
        for s in self._slots:
            s.settle()
        self._writing.clear()

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f, _, _ in self._files.values())
