"""Model-state memory: every flat buffer megalith_zero keeps comes from the engine's
memory resources, one statistics adaptor per kind of state, so the bytes each rank
holds are read from the engine's accounting (and the memory-budget tests can check
them against ZeRO's formulas).

The one exception are stage 3's gathered chunks: autograd keeps views of the
parameters it saves for backward, so a gathered chunk must be freed and refilled
in the *same* storage (resized to 0 and back), which only a torch-allocated
storage can do. Their bytes are tallied here as "gathered".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from megalith_core import _engine

#: kinds of state, as reported by StateMemory.report()
KINDS = ("params", "master", "optim_states", "grads", "grads_in_flight", "gathered")

_ENGINE_DTYPE = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float64: "f64",
}


@dataclass(frozen=True)
class Usage:
    current_bytes: int
    peak_bytes: int


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


class StateMemory:
    """Allocates flat model-state buffers on one device through the engine."""

    def __init__(self, device: torch.device):
        mem = _engine.memory
        self.device = device
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            upstream = mem.PoolResource(mem.DeviceResource(index))
        elif device.type == "cpu":
            upstream = mem.HostResource()
        else:
            raise ValueError(f"megalith_zero: parameters on {device}; expected cpu or cuda")
        self._stats = {kind: mem.StatisticsAdaptor(upstream) for kind in KINDS[:-1]}
        self.gathered = _Tally()
        #: an Offloader (megalith_offload) whose tiers join the report, or None
        self.offloader: Any = None

    def empty(self, kind: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor of `numel` elements in engine memory, counted under `kind`.
        The memory goes back to the engine when the last view of it dies."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(numel, 1) * itemsize
        try:
            buf = self._stats[kind].allocate(nbytes, 256)
        except MemoryError:
            if self.device.type != "cuda":
                raise
            # torch's caching allocator may hold freed blocks the engine's pool cannot
            # reuse (the model's original parameters, last step's activations): give
            # them back to the driver and try once more.
            torch.cuda.empty_cache()
            buf = self._stats[kind].allocate(nbytes, 256)
        return torch.from_dlpack(buf.view(_ENGINE_DTYPE[dtype], numel))

    def release_torch_cache(self) -> None:
        """Returns torch's cached free device blocks to the driver, so that the engine's
        pool can have them (called once the model's parameters moved into chunks)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def zeros(self, kind: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.empty(kind, numel, dtype).zero_()

    def usage(self, kind: str) -> Usage:
        if kind == "gathered":
            return Usage(self.gathered.current_bytes, self.gathered.peak_bytes)
        s = self._stats[kind]
        return Usage(int(s.current_bytes), int(s.peak_bytes))

    def report(self) -> dict[str, Usage]:
        """Bytes per kind on the device tier (where the params live) and, with
        offloading, per "<kind>@host" and "optim_states@nvme" (swap file bytes)."""
        out = {kind: self.usage(kind) for kind in KINDS}
        if self.offloader is not None:
            out.update({k: Usage(*v) for k, v in self.offloader.report().items()})
        return out

    def reset_peak(self) -> None:
        for s in self._stats.values():
            s.reset_peak()
        self.gathered.reset_peak()
        if self.offloader is not None:
            self.offloader.reset_peak()
