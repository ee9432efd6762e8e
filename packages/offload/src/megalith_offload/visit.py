"""DeviceVisits: offloaded chunks updated by the device kernel, their states streamed.

[Note: visiting chunks]
An offloaded chunk's fp32 master and optimizer states live in host memory, and the
host kernel updates them (host_step.py). When the host update is what bounds the step
(a 12B GPT on one H200 with 16 host cores: 1.3 s of a 1.7 s step), the GPU and its
copy engines sit partly idle. A visiting chunk keeps its home on the host but is
updated on the device: its master and states come up into one of a few device slots
(prefetched: the next chunk's copy runs while this one is updated), the device kernel
updates them and writes the working parameters in place, and they go back down (after
its update the chunk's next use is the next step, the furthest there is, so it leaves
at once). That moves 12 B/param up and 12 B/param down (Adam, fp32 master) where the
host update moves 2 + 2 but spends host cores, so the two run side by side: the host
updates some chunks while the copy engines carry others.

Streams: copies up on `up`, the update on the caller's step stream (after the compute
stream, where the gradients were finished, and after the copy up), copies down on
`down`; a slot is reused only after its last copy down. The host never waits except in
wait(), which also makes the caller's stream wait for the last update. On CPU ranks the
same runs with plain copies into slots of CPU memory (for tests: same numbers as the
host kernel).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from megalith_core.memory import StateMemory

from .chunk import OffloadableChunk

#: (device master, device states by name) -> None: the chunk's update on the device
Apply = Callable[[torch.Tensor, dict[str, torch.Tensor]], None]


class DeviceVisits:
    def __init__(
        self,
        numel: int,
        names: tuple[str, ...],
        memory: StateMemory,
        step_stream: torch.cuda.Stream | None,
        slots: int = 2,
    ):
        """numel: the largest visiting chunk's shard; names: the most optimizer states
        any of them has; memory: the device arena (the slots are counted as master
        and optim_states there)."""
        self.device = memory.device
        self.cuda = self.device.type == "cuda"
        self.slots = [
            (
                memory.empty("master", numel, torch.float32),
                {n: memory.empty("optim_states", numel, torch.float32) for n in names},
            )
            for _ in range(slots)
        ]
        self._free: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0
        self._step = step_stream
        if self.cuda:
            self._up = torch.cuda.Stream(self.device)
            self._down = torch.cuda.Stream(self.device)
        self._last_step: torch.cuda.Event | None = None
        self._last_down: torch.cuda.Event | None = None

    @property
    def slot_bytes(self) -> int:
        master, states = self.slots[0]
        return master.nbytes + sum(t.nbytes for t in states.values())

    def submit(self, chunk: OffloadableChunk, names: tuple[str, ...], apply: Apply) -> None:
        """Updates the chunk on the device; its gradients must be final in the caller's
        stream order now. Its host master and states are written back asynchronously
        (wait() before reading them on the host)."""
        i, self._next = self._next, (self._next + 1) % len(self.slots)
        slot_master, slot_states = self.slots[i]
        n = chunk.master.numel()
        master = slot_master[:n]
        states = {name: slot_states[name][:n] for name in names}
        if not self.cuda:
            master.copy_(chunk.master)
            for name in names:
                states[name].copy_(chunk.states[name])
            apply(master, states)
            chunk.master.copy_(master)
            for name in names:
                chunk.states[name].copy_(states[name])
            return
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._up):
            if self._free[i] is not None:
                self._up.wait_event(self._free[i])
            master.copy_(chunk.master, non_blocking=True)
            for name in names:
                states[name].copy_(chunk.states[name], non_blocking=True)
        step = self._step or compute
        step.wait_stream(compute)
        step.wait_stream(self._up)
        with torch.cuda.stream(step):
            apply(master, states)
            stepped = torch.cuda.Event()
            stepped.record(step)
        with torch.cuda.stream(self._down):
            self._down.wait_event(stepped)
            chunk.master.copy_(master, non_blocking=True)
            for name in names:
                chunk.states[name].copy_(states[name], non_blocking=True)
            freed = torch.cuda.Event()
            freed.record(self._down)
        self._free[i] = self._last_down = freed
        self._last_step = stepped

    def wait(self) -> None:
        """The caller's stream waits for the last update (the working parameters); the
        host waits for the last copy down (the host master and states)."""
        if not self.cuda:
            return
        if self._last_step is not None:
            torch.cuda.current_stream(self.device).wait_event(self._last_step)
        if self._last_down is not None:
            self._last_down.synchronize()
        self._last_step = self._last_down = None


def link_seconds_per_byte(host: torch.Tensor, device: torch.device) -> float:
    """Seconds per byte for a visit's copies between `host` memory (a chunk's pinned
    master) and `device`: the slower of up and down, each timed alone (in a visit they
    run at once, on separate copy engines). The values come back unchanged. At most
    PROBE_BYTES are moved; on CPU ranks this times plain copies."""
    n = min(host.numel(), PROBE_BYTES // host.element_size())
    src = host[:n]
    tmp = torch.empty_like(src, device=device)
    timings = []
    for dst, s in ((tmp, src), (src, tmp)):  # up, then back down (the same values)
        dst.copy_(s, non_blocking=True)  # a first, untimed pass: allocator and TLB warm
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            dst.copy_(s, non_blocking=True)
            end.record()
            end.synchronize()
            timings.append(begin.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            dst.copy_(s)
            timings.append(time.perf_counter() - start)
    del tmp
    if device.type == "cuda":  # torch's cache is memory the engine's chunks cannot reuse
        torch.cuda.empty_cache()
    return max(timings) / (n * src.element_size())


#: bytes moved each way by link_seconds_per_byte: enough to reach the link's speed
PROBE_BYTES = 256 << 20
