"""Point-to-point send/recv of a tensor or a tuple/list of tensors, metadata cached.

[Note: the p2p protocol]
Each (group, peer, tag) direction keeps the structure (container kind, shapes,
dtypes) of its last message at both ends, so the two ends always agree on it.
Every message starts with a 2-int64 header (flag, metadata length):
- NEW (no structure cached yet): header; then the metadata (int64); then the data.
- SAME: header and data go as one batch; the receiver posts the data buffers in the
  same batch as the header, from its cached structure. This is the common case:
  no metadata, no extra round trip.
- CHANGED: the sender saw a different structure. Because the receiver has already
  posted buffers of the old structure with the header, the sender fills them with
  a zero payload of the old structure, then sends the new metadata and the data.
  Both ends cache the new structure.
The receiver allocates on `device` (default: the world's device). NCCL has no
tags: its messages to one peer arrive in order, so tags only keep caches apart.
`send(..., async_op=True)` posts all of a message's parts at once and returns a
Handle: a Gloo send does not complete until the peer posts its receive, so two
ranks that each send to the other before receiving (a pipeline's activations one
way, gradients the other) need the sends in flight while they receive.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .backends import ops_for
from .debug import DTYPES
from .group import ProcessGroup, resolve
from .handle import Handle, launch

NEW, SAME, CHANGED = 1, 2, 3
_KINDS = (torch.Tensor, tuple, list)

Structure = tuple[int, tuple[tuple[tuple[int, ...], torch.dtype], ...]]
# How often metadata went out / came in (tests check that the cache skips it).
STATS = {"metadata_sent": 0, "metadata_received": 0}
# Per group: {(peer, tag): structure} for each direction; dropped with the group.
_send_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_recv_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _structure(obj: Any) -> tuple[Structure, list[torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        kind, tensors = 0, [obj]
    elif isinstance(obj, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in obj):
        kind, tensors = (1 if isinstance(obj, tuple) else 2), list(obj)
    else:
        raise TypeError(
            f"send: expected a tensor or a tuple/list of tensors, got {type(obj).__name__}"
        )
    for t in tensors:
        if t.dtype not in DTYPES:
            raise TypeError(f"send: dtype {t.dtype} cannot be sent")
    return (kind, tuple((tuple(t.shape), t.dtype) for t in tensors)), tensors


def _encode(structure: Structure) -> list[int]:
    kind, items = structure
    out = [kind, len(items)]
    for shape, dtype in items:
        out += [DTYPES.index(dtype), len(shape), *shape]
    return out


def _decode(meta: list[int]) -> Structure:
    kind, n, i, items = meta[0], meta[1], 2, []
    for _ in range(n):
        dtype, ndim = DTYPES[meta[i]], meta[i + 1]
        items.append((tuple(meta[i + 2 : i + 2 + ndim]), dtype))
        i += 2 + ndim
    return kind, tuple(items)


def _empty(structure: Structure, device: torch.device) -> list[torch.Tensor]:
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in structure[1]]


def _pack(structure: Structure, tensors: list[torch.Tensor]) -> Any:
    kind = structure[0]
    return tensors[0] if kind == 0 else tuple(tensors) if kind == 1 else list(tensors)


def _exchange(g: ProcessGroup, device: torch.device, what: str, ops: list) -> None:
    """Posts ops as one batch (batched isend/irecv, or one NCCL group) and waits."""
    if not ops:
        return
    backend = ops_for(g, device)
    works = launch(g, what, lambda: backend.p2p(ops))
    Handle(g, what, works).wait()


def send(
    obj: Any, dst: int, group: ProcessGroup | None = None, tag: int = 0, async_op: bool = False
) -> Handle | None:
    """Sends a tensor or a tuple/list of tensors to global rank dst (blocking).

    async_op=True returns a Handle at once; wait() on it before changing the tensors.
    """
    g = resolve(group)
    peer = _peer(g, "send", "dst", dst)
    structure, tensors = _structure(obj)
    devices = {t.device for t in tensors} or {g.world.device}
    if len(devices) != 1:
        raise ValueError(
            f"send: all tensors must be on one device, got {sorted(map(str, devices))}"
        )
    device = devices.pop()
    cache, key = _send_cache.setdefault(g, {}), (peer, tag)
    data = [("send", t.contiguous(), peer, tag) for t in tensors]
    old = cache.get(key)
    what = f"send to rank {dst} (tag {tag}) on group {g.name!r}"
    meta = torch.tensor(_encode(structure), dtype=torch.int64, device=device)
    if old == structure:
        header = torch.tensor([SAME, 0], dtype=torch.int64, device=device)
        if async_op:
            return _post(g, device, what, [("send", header, peer, tag), *data])
        _exchange(g, device, what, [("send", header, peer, tag), *data])
        return None
    header_flag = NEW if old is None else CHANGED
    header = torch.tensor([header_flag, meta.numel()], dtype=torch.int64, device=device)
    first = [("send", header, peer, tag)]
    if old is not None:  # fill the buffers the receiver posted for the old structure
        first += [("send", t.zero_(), peer, tag) for t in _empty(old, device)]
    if async_op:  # one (peer, tag) delivers in posting order, so every part goes at once
        STATS["metadata_sent"] += 1
        cache[key] = structure
        return _post(g, device, what, [*first, ("send", meta, peer, tag), *data])
    _exchange(g, device, what, first)
    _exchange(g, device, what, [("send", meta, peer, tag)])
    STATS["metadata_sent"] += 1
    _exchange(g, device, what, data)
    cache[key] = structure
    return None


def _post(g: ProcessGroup, device: torch.device, what: str, ops: list) -> Handle:
    """Posts ops as one batch without waiting; the Handle keeps the tensors alive."""
    works = launch(g, what, lambda: ops_for(g, device).p2p(ops))
    return Handle(g, what, works, result=None, then=[lambda: ops.clear()])


def recv(
    src: int,
    group: ProcessGroup | None = None,
    tag: int = 0,
    device: torch.device | str | None = None,
) -> Any:
    """Receives what global rank src sent with the same tag (a tensor, tuple or list)."""
    g = resolve(group)
    peer = _peer(g, "recv", "src", src)
    device = torch.device(device) if device is not None else g.world.device
    cache, key = _recv_cache.setdefault(g, {}), (peer, tag)
    cached = cache.get(key)
    what = f"recv from rank {src} (tag {tag}) on group {g.name!r}"
    header = torch.empty(2, dtype=torch.int64, device=device)
    bufs = _empty(cached, device) if cached is not None else []
    _exchange(g, device, what, [("recv", t, peer, tag) for t in (header, *bufs)])
    flag, meta_len = header.tolist()
    if flag == SAME and cached is not None:
        return _pack(cached, bufs)
    if flag not in (NEW, CHANGED):
        raise RuntimeError(f"{what}: unexpected p2p header {flag} (send/recv calls out of step?)")
    meta = torch.empty(meta_len, dtype=torch.int64, device=device)
    _exchange(g, device, what, [("recv", meta, peer, tag)])
    structure = _decode(meta.tolist())
    STATS["metadata_received"] += 1
    bufs = _empty(structure, device)
    _exchange(g, device, what, [("recv", t, peer, tag) for t in bufs])
    cache[key] = structure
    return _pack(structure, bufs)


def _peer(g: ProcessGroup, op: str, name: str, rank: int) -> int:
    if rank not in g.ranks:
        raise ValueError(
            f"{op}: {name}={rank} is not a rank of group {g.name!r} (global ranks {list(g.ranks)})"
        )
    if rank == g.world.rank:
        raise ValueError(f"{op}: {name}={rank} is this rank; a rank cannot send to itself")
    return g.group_rank(rank)


def clear_cache() -> None:
    """Forgets every cached structure (both ends must do it together)."""
    _send_cache.clear()
    _recv_cache.clear()
