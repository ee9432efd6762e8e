"""Bucketer: many small tensors reduced as a few flat buckets, overlapping with compute.

    b = Bucketer(group, bucket_bytes=25 << 20, op="avg")        # mode="all_reduce"
    for p in reversed(params): b.add(p.grad)   # full buckets start as they fill
    b.flush(); b.wait()                          # every grad now holds the average

Tensors are grouped per (dtype, device); a bucket starts (asynchronously) as soon
as adding the next tensor would take it past `bucket_bytes`, so its communication
runs while the caller keeps computing and adding. `wait()` finishes the buckets in
launch order and copies the results back.

mode="reduce_scatter" is for flat-sharded layouts (ZeRO): each bucket is padded to
a multiple of the group size and reduce-scattered; rank r keeps elements
[r * S, (r + 1) * S) of the flat bucket. `wait()` writes that shard back into the
parts of the tensors it covers and returns one Shard per bucket saying which.

Every rank must add the same tensors (shapes, dtypes) in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .collectives import all_reduce, reduce_scatter
from .group import ProcessGroup, resolve
from .handle import Handle

DEFAULT_BUCKET_BYTES = 25 << 20  # torch DDP's default


@dataclass
class Shard:
    """This rank's part of one reduce-scattered bucket.

    data: the reduced elements [start, stop) of the padded flat bucket.
    pieces: (tensor index in add order, offset in that tensor, offset in data, length).
    """

    bucket: int
    start: int
    stop: int
    data: torch.Tensor
    pieces: list[tuple[int, int, int, int]]


@dataclass
class _Bucket:
    index: int
    dtype: torch.dtype
    device: torch.device
    items: list[tuple[int, torch.Tensor, int]] = field(default_factory=list)  # (id, tensor, offset)
    numel: int = 0
    flat: torch.Tensor | None = None
    out: torch.Tensor | None = None
    handle: Handle | None = None

    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class Bucketer:
    def __init__(
        self,
        group: ProcessGroup | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        op: str = "sum",
        mode: str = "all_reduce",
    ):
        if mode not in ("all_reduce", "reduce_scatter"):
            raise ValueError(f"Bucketer: mode={mode!r}; expected 'all_reduce' or 'reduce_scatter'")
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"Bucketer: bucket_bytes={bucket_bytes!r} must be a positive integer")
        self.group = resolve(group)
        self.bucket_bytes = bucket_bytes
        self.op = op
        self.mode = mode
        self._open: dict[tuple[torch.dtype, torch.device], _Bucket] = {}
        self._launched: list[_Bucket] = []
        self._count = 0  # tensors added
        self._buckets = 0

    @property
    def launched(self) -> int:
        """Buckets started so far (since the last wait)."""
        return len(self._launched)

    def add(self, tensor: torch.Tensor) -> None:
        """Adds a tensor (its current values); starts its bucket if that is now full."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"Bucketer.add: expected a tensor, got {type(tensor).__name__}")
        key = (tensor.dtype, tensor.device)
        bucket = self._open.get(key)
        nbytes = tensor.numel() * tensor.element_size()
        if bucket is not None and bucket.items and bucket.nbytes() + nbytes > self.bucket_bytes:
            self._launch(self._open.pop(key))
            bucket = None
        if bucket is None:
            bucket = self._open[key] = _Bucket(self._buckets, tensor.dtype, tensor.device)
            self._buckets += 1
        bucket.items.append((self._count, tensor, bucket.numel))
        bucket.numel += tensor.numel()
        self._count += 1
        if bucket.nbytes() >= self.bucket_bytes:
            self._launch(self._open.pop(key))

    def flush(self) -> None:
        """Starts every partly filled bucket (in the order they were opened)."""
        for bucket in sorted(self._open.values(), key=lambda b: b.index):
            self._launch(bucket)
        self._open.clear()

    def _launch(self, bucket: _Bucket) -> None:
        size = self.group.size
        padded = -(-bucket.numel // size) * size if self.mode == "reduce_scatter" else bucket.numel
        flat = torch.zeros(padded, dtype=bucket.dtype, device=bucket.device)
        for _, t, offset in bucket.items:
            flat[offset : offset + t.numel()].copy_(t.reshape(-1))
        bucket.flat = flat
        if self.mode == "all_reduce":
            bucket.handle = all_reduce(flat, self.op, self.group, async_op=True)
        else:
            bucket.out = torch.empty(padded // size, dtype=bucket.dtype, device=bucket.device)
            bucket.handle = reduce_scatter(bucket.out, flat, self.op, self.group, async_op=True)
        self._launched.append(bucket)

    def wait(self) -> list[Shard]:
        """Flushes, finishes every bucket, copies results back; Shards in reduce_scatter mode."""
        self.flush()
        shards = []
        for bucket in self._launched:
            bucket.handle.wait()
            if self.mode == "all_reduce":
                for _, t, offset in bucket.items:
                    t.copy_(bucket.flat[offset : offset + t.numel()].view(t.shape))
            else:
                shards.append(self._write_shard(bucket))
            bucket.flat = bucket.handle = None
        self._launched = []
        return shards

    def _write_shard(self, bucket: _Bucket) -> Shard:
        n = bucket.out.numel()
        start, stop = self.group.rank * n, (self.group.rank + 1) * n
        pieces = []
        for index, t, offset in bucket.items:
            lo, hi = max(start, offset), min(stop, offset + t.numel())
            if lo < hi:
                pieces.append((index, lo - offset, lo - start, hi - lo))
                flat_t = t.view(-1) if t.is_contiguous() else None
                if flat_t is not None:
                    flat_t[lo - offset : hi - offset].copy_(bucket.out[lo - start : hi - start])
                else:  # not contiguous: go through a contiguous copy
                    tmp = t.reshape(-1).clone()
                    tmp[lo - offset : hi - offset].copy_(bucket.out[lo - start : hi - start])
                    t.copy_(tmp.view(t.shape))
        return Shard(bucket.index, start, stop, bucket.out, pieces)


def all_reduce_coalesced(
    tensors: Sequence[torch.Tensor],
    op: str = "sum",
    group: ProcessGroup | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> None:
    """All-reduces every tensor in place, through flat buckets."""
    b = Bucketer(group, bucket_bytes, op, "all_reduce")
    for t in tensors:
        b.add(t)
    b.wait()


def reduce_scatter_coalesced(
    tensors: Sequence[torch.Tensor],
    op: str = "sum",
    group: ProcessGroup | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> list[Shard]:
    """Reduce-scatters the tensors as padded flat buckets; returns this rank's Shards."""
    b = Bucketer(group, bucket_bytes, op, "reduce_scatter")
    for t in tensors:
        b.add(t)
    return b.wait()
