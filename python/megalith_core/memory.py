"""StateMemory: the memory arena for training state, on a device or in (pinned) host memory.

Every flat buffer ZeRO and offloading keep comes from the engine's memory resources,
one statistics adaptor per kind of state, so the bytes each rank holds are read from
the engine's accounting (and the memory-budget tests can check them against ZeRO's
formulas). One class serves both places:

- `StateMemory(device)`: beside the parameters (GPU memory through a pool, or host
  memory on CPU ranks, where the CPU is the simulated device);
- `StateMemory.host(limit_bytes, pinned)`: host memory for offloaded state, page-locked
  when asked or (pinned=None) when a GPU is there, 4096-byte aligned for the NVMe path's
  O_DIRECT transfers, optionally under a byte limit the engine enforces.

The one exception are stage 3's gathered chunks: autograd keeps views of the
parameters it saves for backward, so a gathered chunk must be freed and refilled
in the *same* storage (resized to 0 and back), which only a torch-allocated
storage can do. Their bytes are tallied here as "gathered".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

import torch

from megalith_core import _engine

#: kinds of state a device arena reports, whether allocated or not
KINDS = ("params", "master", "optim_states", "grads", "grads_in_flight", "gathered")

#: alignment of host-arena buffers: the NVMe path's O_DIRECT transfers need 4096
HOST_ALIGNMENT = 4096
DEVICE_ALIGNMENT = 256

_ENGINE_DTYPE = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float64: "f64",
    torch.uint8: "u8",
    torch.int8: "i8",  # q8 optimizer-state codes (megalith_core.optim.flat_states)
}


class Usage(NamedTuple):
    current_bytes: int
    peak_bytes: int


class Reporter(Protocol):
    """Another holder of training state whose bytes join an arena's report."""

    def report(self) -> dict[str, tuple[int, int]]: ...  # (current, peak) bytes by kind

    def reset_peak(self) -> None: ...


class _Tally:
    """Bytes of torch-owned storages we resize ourselves (stage 3 gathered chunks)."""

    def __init__(self) -> None:
        self.current_bytes = 0
        self.peak_bytes = 0

    def add(self, n: int) -> None:
        self.current_bytes += n
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def reset_peak(self) -> None:
        self.peak_bytes = self.current_bytes


def host_resource(pinned: bool | None = None) -> _engine.memory.Resource:
    """PinnedHostResource when asked, or (pinned=None) when a GPU is there; else HostResource."""
    mem = _engine.memory
    if pinned is None:
        pinned = torch.cuda.is_available()
    return mem.PinnedHostResource() if pinned else mem.HostResource()


class StateMemory:
    """Flat 1-D buffers by kind ("params", "master", "optim_states", "grad_staging", ...)."""

    def __init__(
        self,
        device: torch.device | str,
        *,
        pinned: bool = False,
        limit_bytes: int | None = None,
        kinds: Iterable[str] = KINDS,
    ):
        """device: where the buffers live; pinned: page-locked host memory (device "cpu");
        limit_bytes: at most this many bytes in all, enforced by the engine; kinds: those
        report() lists before any allocation ("gathered": the stage-3 tally)."""
        mem = _engine.memory
        self.device = torch.device(device)
        self.alignment = DEVICE_ALIGNMENT
        if self.device.type == "cuda":
            index = self.device.index
            index = index if index is not None else torch.cuda.current_device()
            upstream = mem.PoolResource(mem.DeviceResource(index))
        elif self.device.type == "cpu":
            upstream = host_resource(pinned)
        else:
            raise ValueError(f"megalith_core.memory: {self.device}; expected cpu or cuda")
        self.pinned = isinstance(upstream, mem.PinnedHostResource)
        if limit_bytes is not None:
            upstream = mem.LimitingAdaptor(upstream, limit_bytes)
        self.limit_bytes = limit_bytes
        self._upstream = upstream
        self._stats: dict[str, _engine.memory.StatisticsAdaptor] = {}
        kinds = tuple(kinds)
        self._tallied = "gathered" in kinds
        for kind in kinds:
            if kind != "gathered":
                self._adaptor(kind)
        self.gathered = _Tally()
        self._joined: list[Reporter] = []

    @classmethod
    def host(
        cls, limit_bytes: int | None = None, pinned: bool | None = None, kinds: Iterable[str] = ()
    ) -> StateMemory:
        """Host memory for offloaded state: pinned as asked, or (None) when a GPU is there."""
        if pinned is None:
            pinned = torch.cuda.is_available()
        arena = cls("cpu", pinned=pinned, limit_bytes=limit_bytes, kinds=kinds)
        arena.alignment = HOST_ALIGNMENT
        return arena

    def _adaptor(self, kind: str) -> _engine.memory.StatisticsAdaptor:
        if kind not in self._stats:
            self._stats[kind] = _engine.memory.StatisticsAdaptor(self._upstream)
        return self._stats[kind]

    def empty(self, kind: str, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A 1-D tensor of `numel` elements in engine memory, counted under `kind`.
        The memory goes back to the engine when the last view of it dies."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(numel, 1) * itemsize
        adaptor = self._adaptor(kind)
        try:
            buf = adaptor.allocate(nbytes, self.alignment)
        except MemoryError as e:
            if self.device.type != "cuda":
                if self.limit_bytes is None:
                    raise
                raise MemoryError(
                    f"megalith_core.memory: {nbytes} bytes of host memory for {kind} do not fit "
                    f"(host budget {self.limit_bytes} bytes, {self.current_bytes} in use): {e}"
                ) from e
            # torch's caching allocator may hold freed blocks the engine's pool cannot
            # reuse (the model's original parameters, last step's activations): give
            # them back to the driver and try once more.
            torch.cuda.empty_cache()
            buf = adaptor.allocate(nbytes, self.alignment)
        return torch.from_dlpack(buf.view(_ENGINE_DTYPE[dtype], numel))

    def zeros(self, kind: str, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.empty(kind, numel, dtype).zero_()

    def release_torch_cache(self) -> None:
        """Returns torch's cached free device blocks to the driver, so that the engine's
        pool can have them (called once the model's parameters moved into chunks)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def current_bytes(self) -> int:
        return sum(int(s.current_bytes) for s in self._stats.values())

    def usage(self, kind: str) -> Usage:
        if kind == "gathered":
            return Usage(self.gathered.current_bytes, self.gathered.peak_bytes)
        s = self._stats[kind]
        return Usage(int(s.current_bytes), int(s.peak_bytes))

    def join(self, other: Reporter) -> None:
        """Adds another holder's bytes to report() and its peaks to reset_peak() (ZeRO's
        device arena joins the offload tiers, so one report says where everything is)."""
        self._joined.append(other)

    def report(self) -> dict[str, Usage]:
        """(current, peak) bytes per kind, from the engine's adaptors, then those of
        every joined holder ("<kind>@host", "optim_states@nvme", ...)."""
        kinds = list(self._stats)
        if self._tallied:  # a device arena: its kinds in KINDS' order, the tally with them
            listed = [k for k in KINDS if k in self._stats or k == "gathered"]
            kinds = listed + [k for k in kinds if k not in listed]
        out = {kind: self.usage(kind) for kind in kinds}
        for other in self._joined:
            out.update({k: Usage(*v) for k, v in other.report().items()})
        return out

    def reset_peak(self) -> None:
        for s in self._stats.values():
            s.reset_peak()
        self.gathered.reset_peak()
        for other in self._joined:
            other.reset_peak()
