"""Activations forward and gradients backward between the stages of one pipeline.

Each stage boundary is two channels: activations of stage s to stage s+1 (tag
2s) and input gradients of stage s+1 back to stage s (tag 2s+1). Messages go
through megalith_comm's point-to-point send/recv, which caches each channel's
shapes and dtypes at both ends: after the first micro-batch only the data moves.
Micro-batches cross every channel in ascending order, so the order of sends is
the order of receives.

An activation message is its tensors plus a few bytes of JSON spec (containers,
dict keys, which tensors require grad; tree.py), sent as the message's note
(megalith_comm.send(note=...)): cached with the shapes at both ends and read on
the host, so neither end copies it between host and GPU. A gradient message is the
gradients of just the tensors that required grad, so it needs no spec: both ends
know the list from the activation. Sends are asynchronous (a Gloo send completes
only once the peer receives, and neighbours send to each other at the same
time); wait() at the end of the step finishes them. Stages on the same rank hand
messages over in memory.

[Note: receive in the sender's order] NCCL matches the messages between two
ranks by their order alone (tags only keep megalith_comm's shape caches apart),
and interleaved and ZB-V schedules can need a peer's messages in another order
than the peer sends them. So a rank always receives from a peer in the peer's
send order, known from the schedule: asked for a message, it first receives (and
keeps) whatever that peer sent before it. This never waits longer than the
message asked for would: the peer sent those first. One path for Gloo and NCCL.

[Note: early receives] As soon as a message from a peer is taken, the next one that
peer will send is posted (megalith_comm's recv(async_op=True)): with the structure
cached, its buffers are posted too, so the data moves while this rank computes and
the pass that needs it finds it there. A gradient is posted early only once this
rank sent the activation it answers, since only then is it known to come at all
(an activation with nothing requiring grad gets none back). Early receives are on
by default on CPU ranks only (Channels.early says why). On CUDA the links to every
peer are made together at the first step (megalith_comm.p2p.connect).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

import megalith_comm as comm

from .schedule import BACKWARD, FORWARD, INPUT_GRAD, Schedule
from .tree import decode_spec, encode_spec, flatten, unflatten

Message = tuple[list[torch.Tensor], tuple[int, ...]]  # tensors, note (an activation's spec)


class Channels:
    def __init__(self, schedule: Schedule, group: comm.ProcessGroup, device: torch.device):
        if group.size != schedule.pp:
            raise ValueError(
                f"pipeline: the pp group has {group.size} ranks but the schedule is for pp={schedule.pp}"
            )
        self.schedule = schedule
        self.group = group
        self.rank = group.rank
        self.set_device(device)
        # See [Note: early receives]: on by default on CPU only; MEGALITH_PIPELINE_EARLY_RECV=1|0
        # overrides it. On CUDA an early receive is an NCCL kernel waiting on its stream for
        # the peer, and a kernel's first (lazy) load synchronises the whole GPU: on two H200s
        # both ranks then waited on each other within the first step. It ran with
        # CUDA_MODULE_LOADING=EAGER, but no faster than receiving when needed there (the
        # host no longer waits for compute at a receive, so transfers overlap anyway).
        self.early_env = os.environ.get("MEGALITH_PIPELINE_EARLY_RECV")
        # (tag, mb) -> (tensors, note): messages between same-rank stages, and received ones
        self._local: dict[tuple[int, int], Message] = {}
        self._early: dict[tuple[int, int], Message] = {}  # received ahead of need
        self._incoming: dict[int, list[tuple[int, int]]] = {}  # pp rank -> its (tag, mb) to us
        self._next: dict[int, int] = {}  # pp rank -> index of its next message to receive
        self._posted: dict[int, tuple[tuple[int, int], comm.Handle]] = {}  # early receives
        self._connected: torch.device | None = None  # the device whose CUDA links exist
        self._no_grads: set[tuple[int, int]] = set()  # (tag, mb) of gradients that never come
        self._pending: list[comm.Handle] = []
        self.recv_wait_s = 0.0  # time spent blocked in receives this step
        # When each message was posted / waited for and arrived (tag, mb) -> perf_counter
        # times; stats.comm_latency pairs them across ranks.
        self.sent: dict[tuple[int, int], float] = {}
        self.received: dict[tuple[int, int], tuple[float, float]] = {}

    def set_device(self, device: torch.device) -> None:
        """Where received tensors are allocated (the stages' device)."""
        self.device = device

    @property
    def early(self) -> bool:
        """Whether receives are posted before they are needed ([Note: early receives])."""
        if self.early_env:
            return self.early_env != "0"
        return self.device.type != "cuda"

    def begin(self, train: bool) -> None:
        """Starts a step: what each peer will send this rank, in its order (forward-only
        steps send no gradients), with the first message of each posted early."""
        messages = self._messages(train)
        self._connect(messages)
        self._incoming = {}
        for sender, receiver, tag, mb in messages:
            if receiver == self.rank:
                self._incoming.setdefault(sender, []).append((tag, mb))
        self._next = dict.fromkeys(self._incoming, 0)
        self._posted.clear()
        self._early.clear()
        self._no_grads.clear()
        self.recv_wait_s = 0.0
        self.sent, self.received = {}, {}
        for src in self._incoming:
            self._post_next(src)

    def _messages(self, train: bool) -> list[tuple[int, int, int, int]]:
        """Every message between different ranks in a step, (sender pp rank, receiver pp
        rank, tag, mb), each sender's in its send order."""
        kinds = (FORWARD, BACKWARD, INPUT_GRAD) if train else (FORWARD,)
        out = []
        for r, order in enumerate(self.schedule.orders):
            for a in order:
                if a.kind not in kinds:
                    continue
                if a.kind == FORWARD:
                    to, tag = a.stage + 1, 2 * a.stage
                else:
                    to, tag = a.stage - 1, 2 * (a.stage - 1) + 1
                if 0 <= to < self.schedule.num_stages and self.schedule.rank_of(to) != r:
                    out.append((r, self.schedule.rank_of(to), tag, a.mb))
        return out

    def _connect(self, messages: list[tuple[int, int, int, int]]) -> None:
        """On CUDA, makes the links of every pair of ranks that talk, in one order on all
        ranks (megalith_comm.p2p.connect), once per device."""
        if self.device.type != "cuda" or self._connected == self.device:
            return
        g = self.group
        pairs = {(g.global_rank(s), g.global_rank(r)) for s, r, _, _ in messages}
        comm.p2p.connect(pairs, group=g, device=self.device)
        self._connected = self.device

    def _peer(self, stage: int) -> int | None:
        """The global rank holding `stage`, or None when it is this rank."""
        r = self.schedule.rank_of(stage)
        return None if r == self.rank else self.group.global_rank(r)

    def _send(
        self, stage_to: int, tag: int, mb: int, tensors: list[torch.Tensor], note: bytes = b""
    ) -> None:
        peer = self._peer(stage_to)
        if peer is None:
            self._local[(tag, mb)] = (tensors, tuple(note))
            return
        self.sent[(tag, mb)] = time.perf_counter()
        handle = comm.send(
            tensors, dst=peer, group=self.group, tag=tag, async_op=True, note=tuple(note)
        )
        self._pending.append(handle)
        if tag % 2 == 0:  # its gradient, if it needs one, can now be posted early
            self._post_next(self.schedule.rank_of(stage_to))
        done = [h for h in self._pending if h.is_completed()]
        for h in done:  # surfaces a failed send now, and lets its tensors go
            h.wait()
        self._pending = [h for h in self._pending if h not in done]

    def _recv(self, stage_from: int, tag: int, mb: int) -> Message:
        peer = self._peer(stage_from)
        if peer is None:
            return self._local.pop((tag, mb))
        src = self.schedule.rank_of(stage_from)
        while (tag, mb) not in self._early:  # see [Note: receive in the sender's order]
            if src not in self._posted and not self._post_next(src, now=True):
                raise RuntimeError(
                    f"pipeline: pp rank {self.rank} waits for (tag {tag}, micro-batch {mb}) "
                    f"from pp rank {src}, which sends nothing more this step"
                )
            key, handle = self._posted.pop(src)
            start = time.perf_counter()
            tensors, note = handle.wait()
            end = time.perf_counter()
            self.recv_wait_s += end - start
            self.received[key] = (start, end)
            self._early[key] = (list(tensors), note)
            self._post_next(src)  # see [Note: early receives]
        return self._early.pop((tag, mb))

    def _post_next(self, src: int, now: bool = False) -> bool:
        """Posts the receive of src's next message, unless one is posted already or (when
        not `now`) it is a gradient this rank cannot yet know will come. True if posted."""
        if src in self._posted:
            return False
        seq = self._incoming.get(src, [])
        while self._next.get(src, 0) < len(seq) and seq[self._next[src]] in self._no_grads:
            self._next[src] += 1
        if self._next.get(src, 0) >= len(seq):
            return False
        tag, mb = key = seq[self._next[src]]
        if not now and (not self.early or (tag % 2 == 1 and (tag - 1, mb) not in self.sent)):
            return False
        self._next[src] += 1
        peer = self.group.global_rank(src)
        handle = comm.recv(
            src=peer, group=self.group, tag=tag, device=self.device, async_op=True, with_note=True
        )
        self._posted[src] = (key, handle)
        return True

    # -- activations ----------------------------------------------------------
    def send_activation(self, stage: int, mb: int, obj: Any) -> list[torch.Tensor]:
        """Sends stage's output for mb to stage + 1; returns the outputs that require grad."""
        tensors, spec = flatten(obj)
        flags = [t.requires_grad for t in tensors]
        spec_bytes = encode_spec(spec, flags).numpy().tobytes()
        if not any(flags):  # stage + 1 will send no gradient back for this mb
            self._no_grads.add((2 * stage + 1, mb))
        self._send(stage + 1, 2 * stage, mb, [t.detach() for t in tensors], spec_bytes)
        return [t for t, f in zip(tensors, flags) if f]

    def recv_activation(self, stage: int, mb: int) -> tuple[Any, list[torch.Tensor]]:
        """Stage's input for mb (as the previous stage returned it), and its leaves that
        require grad (whose .grad the backward pass sends back)."""
        received, note = self._recv(stage - 1, 2 * (stage - 1), mb)
        spec, flags = decode_spec(torch.tensor(note, dtype=torch.uint8))
        tensors = [t.detach().requires_grad_(f) for t, f in zip(received, flags)]
        return unflatten(spec, tensors), [t for t, f in zip(tensors, flags) if f]

    # -- gradients ----------------------------------------------------------
    def send_grads(self, stage: int, mb: int, grads: list[torch.Tensor]) -> None:
        """The gradients of stage's inputs that require grad, to stage - 1."""
        if grads:
            self._send(stage - 1, 2 * (stage - 1) + 1, mb, [g.detach() for g in grads])

    def recv_grads(self, stage: int, mb: int, count: int) -> list[torch.Tensor]:
        """The gradients of stage's `count` outputs that require grad, from stage + 1."""
        if count == 0:
            return []
        return self._recv(stage + 1, 2 * stage + 1, mb)[0]

    def wait(self) -> None:
        """Finishes every send still in flight (and any receive posted early but not
        needed, which keeps both ends' shape caches in step)."""
        pending, self._pending = self._pending, []
        for h in pending:
            h.wait()
        posted, self._posted = list(self._posted.values()), {}
        for _, h in posted:
            h.wait()
        self._local.clear()
        self._early.clear()
