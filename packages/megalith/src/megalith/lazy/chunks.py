"""A lazily built model materialised a few parameters at a time, for the sharding plugins.

    source = ChunkMaterializer(model, device)   # buffers real now, parameters still lazy
    source(params_of_chunk_0)                   # these parameters real, on device
    ...                                         # (the caller copies its shard, frees them)

megalith_zero.shard(..., materialize=source) calls it once per chunk of its layout
before building the chunk, so a rank never holds more of the model than its shards
plus one chunk (GeminiPlugin, LowLevelZeroPlugin). Each call replays only the recorded
ops its parameters depend on, with the generators' state eager construction had at
each random op (random_ops.py, [Note: replaying a part of the record]): the values are
eager construction's under the same seed, bit for bit, whatever the chunk order.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Sequence

import torch

from .context import _replace, _tensors, _trace_of
from .random_ops import generator_states
from .trace import Trace, ref_of, storage_key, view


def _put(owner: torch.nn.Module, name: str, t: torch.Tensor, new: torch.Tensor, is_param: bool):
    if is_param:
        new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
    try:
        torch.utils.swap_tensors(t, new)
    except RuntimeError:  # a weak reference to it (torch's RNNs keep them)
        _replace(owner, name, new, is_param)


def _libc_trim() -> None:
    """Returns the host heap's free pages to the kernel (glibc's malloc_trim; nothing
    elsewhere). [Note: heap holes between chunks] A chunk's parameters are smaller than
    glibc's mmap threshold (it rises to 32 MiB as large blocks are freed), so they come
    from the heap, and the blocks freed after each chunk is built sit between what the
    chunks keep: the next chunk's tensors, of other sizes, seldom fit them, and the
    resident set grows by the holes (measured: about a chunk and a half more at 245M
    parameters under LowLevelZero)."""
    global _TRIM
    if _TRIM is None:
        name = ctypes.util.find_library("c")
        lib = ctypes.CDLL(name) if name else None
        _TRIM = getattr(lib, "malloc_trim", False) if lib is not None else False
    if _TRIM:
        _TRIM(0)


_TRIM = None
#: trim once this much was materialised since the last trim (a trim walks the heap)
_TRIM_BYTES = 64 << 20


class ChunkMaterializer:
    """Makes a lazily built module's parameters real in the groups it is called with, on
    `device`; its buffers (and any real tensor not on `device`) are made real and moved
    when it is built. device: where the values end up (they are computed where eager
    construction computes them, then moved, so a GPU rank gets the CPU's values).
    checkpoint: a safetensors checkpoint (megalith.pretrained's; with strict) whose
    tensors fill the module's instead: each is read from the files straight into its
    own storage on the device when its chunk comes; what the files do not hold is
    replayed from the record. close() closes the files."""

    def __init__(
        self,
        module: torch.nn.Module,
        device: torch.device | str,
        checkpoint: str | None = None,
        strict: bool = True,
    ) -> None:
        self.device = torch.device(device)
        self._since_trim = 0
        self._files = None
        self._keys: dict[int, str] = {}  # id(tensor) -> the file tensor that fills it
        if checkpoint is not None:
            from ..pretrained.files import CheckpointFiles
            from ..pretrained.load import fit

            self._files = CheckpointFiles(checkpoint)
            slots, found = fit(module, self._files, checkpoint, strict)
            self._keys = {id(slots[i].tensor): key for i, key in found.items()}
        self._where: dict[int, tuple[torch.nn.Module, str]] = {}
        buffers: list[tuple[torch.nn.Module, str, torch.Tensor, bool]] = []
        for owner, name, t, is_param in _tensors(module):
            if is_param:
                self._where[id(t)] = (owner, name)
                if not t.is_meta and t.device != self.device:
                    with torch.no_grad():
                        t.data = t.data.to(self.device)
            elif t.is_meta or id(t) in self._keys:
                buffers.append((owner, name, t, False))
            elif t.device != self.device:
                owner._buffers[name] = t.to(self.device)
        self._materialize(buffers)

    def close(self) -> None:
        if self._files is not None:
            self._files.close()

    def __call__(self, params: Sequence[torch.nn.Parameter]) -> None:
        """params real on the device; a parameter already real is left as it is (or
        overwritten in place from the checkpoint)."""
        stray = [tuple(p.shape) for p in params if id(p) not in self._where]
        if stray:
            raise ValueError(
                f"ChunkMaterializer: parameters of shapes {stray[:3]} are not the module's; "
                "build the optimizer from the lazily built model's parameters"
            )
        items = [(*self._where[id(p)], p, True) for p in params if p.is_meta or id(p) in self._keys]
        if self._since_trim >= _TRIM_BYTES:  # what the chunks before freed
            _libc_trim()  # ([Note: heap holes between chunks])
            self._since_trim = 0
        self._since_trim += sum(p.numel() * p.element_size() for _, _, p, _ in items)
        self._materialize(items)

    def _materialize(self, items: list[tuple[torch.nn.Module, str, torch.Tensor, bool]]) -> None:
        by_trace: dict[int, tuple[Trace, list]] = {}
        for item in items:
            t = item[2]
            key = self._keys.get(id(t))
            if key is not None:
                self._read(item, key)
                continue
            trace = _trace_of(t)
            if trace is None:
                raise ValueError(
                    f"ChunkMaterializer: {item[1]!r} of {type(item[0]).__name__} is on the "
                    "meta device with no record of how to compute it and no checkpoint "
                    "tensor: build the model inside megalith.lazy.LazyInitContext, or load "
                    "a checkpoint that holds it"
                )
            by_trace.setdefault(id(trace), (trace, []))[1].append(item)
        for trace, group in by_trace.values():
            keep = {storage_key(t) for _, _, t, _ in group}
            real = trace.replay(keep, sliced=True, states=generator_states(trace))
            for owner, name, t, is_param in group:
                value = view(real[storage_key(t)], ref_of(t))
                if value.device != self.device:
                    value = value.to(self.device)
                _put(owner, name, t, value, is_param)
            del real

    def _read(self, item: tuple[torch.nn.Module, str, torch.Tensor, bool], key: str) -> None:
        owner, name, t, is_param = item
        if not t.is_meta:  # a real tensor: overwritten in place, as load_into does
            self._files.read_into(key, t.detach())
            return
        value = torch.empty(t.shape, dtype=t.dtype, device=self.device)
        self._files.read_into(key, value)
        _put(owner, name, t, value, is_param)
