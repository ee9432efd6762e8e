"""Point-to-point send/recv of a tensor or a tuple/list of tensors, metadata cached.

[Note: the p2p protocol]
Each (group, peer, tag) direction keeps the structure (container kind, shapes,
dtypes, and the sender's `note`: a few ints the receiver reads on the host) of its
last message at both ends, so the two ends always agree on it.
Every message starts with a 2-int64 header (flag, metadata length):
- NEW (no structure cached yet): header; then the metadata (int64); then the data.
- SAME: header and data go as one batch; the receiver posts the data buffers in the
  same batch as the header, from its cached structure. This is the common case:
  no metadata, no extra round trip, and on the sender no new tensor (the SAME
  header is a constant kept on each device).
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
`recv(..., async_op=True)` posts the header (and, with a cached structure, the
data buffers) at once and returns a Handle; wait() reads the header and, for a
NEW or CHANGED flag, receives the metadata and the data then. So a receive can be
posted long before it is needed (a pipeline posts the next message of each peer
while it computes) and still follow a change of structure.

[Note: p2p on CUDA]
A receive must not make the host wait for the compute queued on the caller's
stream, or the host can never run ahead of the GPU across a pipeline's receives.
So on CUDA:
- Each direction between two ranks (sender -> receiver) has its own two-rank NCCL
  communicator and, on each end, its own stream (`_Link`). NCCL runs one
  communicator's kernels one after another, so with sends and receives on one
  communicator an early receive would wait behind a send that waits for the peer's
  receive: each direction alone keeps a send independent of the receives, as on Gloo.
- A send's stream waits (on the device) for the caller's stream, where the data was
  made. A receive's stream waits for nothing: its buffers are allocated on it.
- The header is copied into pinned host memory on the receive's stream; the host
  waits for that copy only, i.e. for the message, never for queued compute.
- The caller's stream waits on the receive's CUDA event before it uses the data
  (Handle.wait orders it, the host does not block), and the buffers are marked as
  used on the caller's stream so that the allocator reuses them only after it.
- Making a link sends one probe message over it: NCCL connects a pair at its first
  message and holds both hosts until the peer's call, which must not happen to a
  receive posted early. `connect` makes a set of links in one order on every rank.
- A receive posted long before the peer sends is a kernel waiting on the link's
  stream. Whatever synchronises the whole GPU meanwhile (a kernel's first, lazy,
  load; cudaFree) waits for the peer too: with both ranks doing it, they deadlock.
  megalith_pipeline therefore posts early only on CPU ranks by default.
megalith_comm.destroy() aborts every link (close_links) before the groups go.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from . import nccl
from .backends import ops_for
from .debug import DTYPES
from .group import ProcessGroup, resolve
from .handle import Handle, StreamWork, launch

NEW, SAME, CHANGED = 1, 2, 3
_KINDS = (torch.Tensor, tuple, list)

# (container kind, ((shape, dtype) per tensor), note)
Structure = tuple[int, tuple[tuple[tuple[int, ...], torch.dtype], ...], tuple[int, ...]]
# How often metadata went out / came in (tests check that the cache skips it).
STATS = {"metadata_sent": 0, "metadata_received": 0}
# Per group: {(peer, tag): structure} for each direction; dropped with the group.
_send_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_recv_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Per group: {(sender, receiver) global ranks: _Link}, CUDA only.
_links: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# device -> the SAME header on it, made once (a send of a known structure copies nothing).
_same_headers: dict[torch.device, torch.Tensor] = {}


def _structure(obj: Any, note: Sequence[int] = ()) -> tuple[Structure, list[torch.Tensor]]:
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
    items = tuple((tuple(t.shape), t.dtype) for t in tensors)
    return (kind, items, tuple(int(v) for v in note)), tensors


def _encode(structure: Structure) -> list[int]:
    kind, items, note = structure
    out = [kind, len(items)]
    for shape, dtype in items:
        out += [DTYPES.index(dtype), len(shape), *shape]
    return [*out, len(note), *note]


def _decode(meta: list[int]) -> Structure:
    kind, n, i, items = meta[0], meta[1], 2, []
    for _ in range(n):
        dtype, ndim = DTYPES[meta[i]], meta[i + 1]
        items.append((tuple(meta[i + 2 : i + 2 + ndim]), dtype))
        i += 2 + ndim
    return kind, tuple(items), tuple(meta[i + 1 : i + 1 + meta[i]])


def _empty(structure: Structure, device: torch.device) -> list[torch.Tensor]:
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in structure[1]]


def _pack(structure: Structure, tensors: list[torch.Tensor]) -> Any:
    kind = structure[0]
    return tensors[0] if kind == 0 else tuple(tensors) if kind == 1 else list(tensors)


def _same_header(device: torch.device) -> torch.Tensor:
    header = _same_headers.get(device)
    if header is None:
        header = _same_headers[device] = torch.tensor([SAME, 0], dtype=torch.int64, device=device)
    return header


# -- transport: Gloo batches, or a CUDA link per direction -------------------------------------
class _Link:
    """One direction between two ranks on CUDA: a two-rank NCCL communicator (the sender
    is its rank 0) and this end's stream for it. See [Note: p2p on CUDA]."""

    def __init__(self, g: ProcessGroup, device: torch.device, sender: int, receiver: int):
        self.sending = g.world.rank == sender
        pair = SimpleNamespace(
            world=g.world,
            name=f"{g.name}/p2p/{sender}->{receiver}",
            rank=0 if self.sending else 1,
            size=2,
            ranks=(sender, receiver),
        )
        self.comm = nccl.create_communicator(pair, device)
        self.device = device
        self.stream = torch.cuda.Stream(device)  # this direction's messages, in order
        # NCCL (blocking mode) connects a pair at its first message, holding both hosts
        # until the peer's matching call: done here, while both ends are making the link,
        # so that no later receive posted early blocks its host until the peer sends.
        probe = torch.zeros(1, device=device)
        for work in self.post([probe]):
            work.synchronize()

    def post(self, tensors: list[torch.Tensor]) -> list[StreamWork]:
        """Posts tensors as one NCCL group; a send first waits for the caller's stream."""
        stream = self.stream.cuda_stream
        if self.sending:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            for t in tensors:
                t.record_stream(self.stream)
        fn = self.comm.send if self.sending else self.comm.recv
        peer = 1 if self.sending else 0
        works = []
        self.comm.group_start()
        try:
            for t in tensors:
                works.append(StreamWork(fn(t, peer, stream=stream), self.device))
        finally:
            self.comm.group_end()
        return works


def _link(g: ProcessGroup, device: torch.device, sender: int, receiver: int) -> _Link:
    links = _links.setdefault(g, {})
    link = links.get((sender, receiver))
    if link is None:
        link = links[(sender, receiver)] = _Link(g, device, sender, receiver)
    return link


def close_links() -> None:
    """Aborts every CUDA link's communicator (megalith_comm.destroy() calls it): a receive
    still posted on one then fails instead of holding the process at exit."""
    for links in list(_links.values()):
        for link in links.values():
            try:
                link.comm.abort()
            except Exception:  # leaving: a link already broken is fine
                pass
    _links.clear()


def connect(
    pairs: Iterable[tuple[int, int]], group: ProcessGroup | None = None, device: Any = None
) -> None:
    """Creates the CUDA links of the given (sender, receiver) global-rank pairs that
    involve this rank, in one order on every rank (pass the same pairs everywhere).
    Optional: a link is otherwise made at its first message, which makes that first
    send wait for the peer's first receive. A no-op for CPU devices."""
    g = resolve(group)
    device = torch.device(device) if device is not None else g.world.device
    if device.type != "cuda":
        return
    for sender, receiver in sorted(set(pairs)):
        if g.world.rank in (sender, receiver) and sender != receiver:
            _link(g, device, sender, receiver)


def _post(
    g: ProcessGroup,
    device: torch.device,
    peer: int,
    tag: int,
    kind: str,
    tensors: list[torch.Tensor],
    what: str,
) -> list[Any]:
    """Posts one batch of a message's parts to or from group rank `peer`."""
    if not tensors:
        return []
    if device.type == "cuda":
        me, other = g.world.rank, g.global_rank(peer)
        link = _link(g, device, *((me, other) if kind == "send" else (other, me)))
        return launch(g, what, lambda: link.post(tensors))
    ops = [(kind, t, peer, tag) for t in tensors]
    return launch(g, what, lambda: ops_for(g, device).p2p(ops))


class _HostWait:
    """A work whose wait() blocks the host until it finished (CUDA: not the caller's stream)."""

    def __init__(self, work: Any):
        self._work = work

    def wait(self) -> None:
        if isinstance(self._work, StreamWork):
            self._work.synchronize()
        else:
            self._work.wait()

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())


def _host_values(
    g: ProcessGroup, what: str, t: torch.Tensor, works: list[Any], stream: Any
) -> list[int]:
    """t's values once `works` (which fill t) finished; on CUDA through pinned memory on
    the receive's stream, so the host waits for the message only, never for compute."""
    if stream is None:
        Handle(g, what, works).wait()
        return t.tolist()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    with torch.cuda.stream(stream):
        host.copy_(t, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(stream)
    Handle(g, what, [_HostWait(w) for w in works]).wait()  # failures and timeouts, named
    copied.synchronize()
    return host.tolist()


def _alloc(structure: Structure, device: torch.device, stream: Any) -> list[torch.Tensor]:
    """Receive buffers; on CUDA allocated on the receive's stream (see [Note: p2p on CUDA])."""
    if stream is None:
        return _empty(structure, device)
    with torch.cuda.stream(stream):
        return _empty(structure, device)


def _hand_over(bufs: list[torch.Tensor], works: list[Any], device: torch.device) -> None:
    """Orders the caller's stream after the receive and tells the allocator the buffers
    are used there (no host wait). CPU: waits for the works."""
    for w in works:
        w.wait()
    if device.type == "cuda":
        current = torch.cuda.current_stream(device)
        for t in bufs:
            t.record_stream(current)


# -- send ---------------------------------------------------------------------------------------
def _exchange(g: ProcessGroup, device: torch.device, what: str, peer: int, tag: int,
              tensors: list[torch.Tensor]) -> None:  # fmt: skip
    """Sends tensors as one batch and waits (CUDA: orders the caller's stream after it)."""
    Handle(g, what, _post(g, device, peer, tag, "send", tensors, what)).wait()


def send(
    obj: Any,
    dst: int,
    group: ProcessGroup | None = None,
    tag: int = 0,
    async_op: bool = False,
    note: Sequence[int] = (),
) -> Handle | None:
    """Sends a tensor or a tuple/list of tensors to global rank dst (blocking).

    async_op=True returns a Handle at once; wait() on it before changing the tensors.
    note: ints the receiver gets on the host (recv(with_note=True)) without reading a
    device tensor; cached with the structure, so a repeated note costs nothing.
    """
    g = resolve(group)
    peer = _peer(g, "send", "dst", dst)
    structure, tensors = _structure(obj, note)
    devices = {t.device for t in tensors} or {g.world.device}
    if len(devices) != 1:
        raise ValueError(
            f"send: all tensors must be on one device, got {sorted(map(str, devices))}"
        )
    device = devices.pop()
    cache, key = _send_cache.setdefault(g, {}), (peer, tag)
    data = [t.contiguous() for t in tensors]
    old = cache.get(key)
    what = f"send to rank {dst} (tag {tag}) on group {g.name!r}"
    if old == structure:
        parts = [_same_header(device), *data]
        if async_op:
            return _send_handle(g, what, _post(g, device, peer, tag, "send", parts, what), parts)
        _exchange(g, device, what, peer, tag, parts)
        return None
    meta = torch.tensor(_encode(structure), dtype=torch.int64, device=device)
    flag = NEW if old is None else CHANGED
    first = [torch.tensor([flag, meta.numel()], dtype=torch.int64, device=device)]
    if old is not None:  # fill the buffers the receiver posted for the old structure
        first += [t.zero_() for t in _empty(old, device)]
    STATS["metadata_sent"] += 1
    cache[key] = structure
    if async_op:  # one (peer, tag) delivers in posting order, so every part goes at once
        parts = [*first, meta, *data]
        return _send_handle(g, what, _post(g, device, peer, tag, "send", parts, what), parts)
    _exchange(g, device, what, peer, tag, first)
    _exchange(g, device, what, peer, tag, [meta])
    _exchange(g, device, what, peer, tag, data)
    return None


def _send_handle(g: ProcessGroup, what: str, works: list[Any], parts: list) -> Handle:
    """The Handle keeps the tensors alive until waited for."""
    return Handle(g, what, works, result=None, then=[lambda: parts.clear()])


# -- recv ---------------------------------------------------------------------------------------
class _Receive:
    """One message being received: the header (and cached-structure buffers) posted."""

    def __init__(self, g: ProcessGroup, peer: int, tag: int, device: torch.device, what: str):
        self.g, self.peer, self.tag, self.device, self.what = g, peer, tag, device, what
        self.cache, self.key = _recv_cache.setdefault(g, {}), (peer, tag)
        self.cached = self.cache.get(self.key)
        self.stream = None
        if device.type == "cuda":
            me, src = g.world.rank, g.global_rank(peer)
            self.stream = _link(g, device, src, me).stream
        self.header = _alloc((0, (((2,), torch.int64),), ()), device, self.stream)[0]
        self.bufs = _alloc(self.cached, device, self.stream) if self.cached is not None else []
        self.works = self._post([self.header, *self.bufs])

    def _post(self, tensors: list[torch.Tensor]) -> list[Any]:
        return _post(self.g, self.device, self.peer, self.tag, "recv", tensors, self.what)

    def _values(self, t: torch.Tensor, works: list[Any]) -> list[int]:
        return _host_values(self.g, self.what, t, works, self.stream)

    def finish(self) -> tuple[Any, tuple[int, ...]]:
        """The message and its note."""
        flag, meta_len = self._values(self.header, self.works)
        if flag == SAME and self.cached is not None:
            # on Gloo, the header's wait waited for the whole batch (a second wait would hang)
            _hand_over(self.bufs, self.works if self.stream is not None else [], self.device)
            return _pack(self.cached, self.bufs), self.cached[2]
        if flag not in (NEW, CHANGED):
            raise RuntimeError(
                f"{self.what}: unexpected p2p header {flag} (send/recv calls out of step?)"
            )
        meta = _alloc((0, (((meta_len,), torch.int64),), ()), self.device, self.stream)[0]
        structure = _decode(self._values(meta, self._post([meta])))
        STATS["metadata_received"] += 1
        bufs = _alloc(structure, self.device, self.stream)
        _hand_over(bufs, self._post(bufs), self.device)
        self.cache[self.key] = structure
        return _pack(structure, bufs), structure[2]


def recv(
    src: int,
    group: ProcessGroup | None = None,
    tag: int = 0,
    device: torch.device | str | None = None,
    async_op: bool = False,
    with_note: bool = False,
) -> Any:
    """Receives what global rank src sent with the same tag (a tensor, tuple or list);
    with_note=True: (message, the sender's note).

    async_op=True posts the receive and returns a Handle whose wait() returns what
    recv would. Post the next receive from a src after waiting for the previous one:
    a receive posted early takes the structure cached when it is posted.
    """
    g = resolve(group)
    peer = _peer(g, "recv", "src", src)
    device = torch.device(device) if device is not None else g.world.device
    what = f"recv from rank {src} (tag {tag}) on group {g.name!r}"
    receive = _Receive(g, peer, tag, device, what)

    def result() -> Any:
        obj, got_note = receive.finish()
        return (obj, got_note) if with_note else obj

    if not async_op:
        return result()
    handle = Handle(g, what, then=[lambda: setattr(handle, "result", result())])
    return handle


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
