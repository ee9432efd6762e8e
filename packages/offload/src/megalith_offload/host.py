"""The host tier: page-locked host memory when CUDA is there (fast, asynchronous copies
to and from the GPU), pageable host memory otherwise, from the engine's resources.

Every allocation is counted by one engine StatisticsAdaptor per kind of state, over
one LimitingAdaptor that enforces the host budget, so the bytes reported per tier
are the engine's own accounting.
"""

from __future__ import annotations

import os

import torch

from megalith_core import _engine

#: 4096-byte alignment: the NVMe path's O_DIRECT transfers need it
ALIGNMENT = 4096

_ENGINE_DTYPE = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float64: "f64",
    torch.uint8: "u8",
}


def host_threads(requested: int | None = None) -> int:
    """Threads for the offloaded update (see OffloadConfig.cpu_threads)."""
    if requested is not None:
        return requested
    env = os.environ.get("MEGALITH_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    per_rank = max(1, len(os.sched_getaffinity(0)) // local)
    return per_rank - 1 if per_rank > 4 else per_rank


def host_resource(pinned: bool | None = None) -> _engine.memory.Resource:
    """PinnedHostResource when asked, or (pinned=None) when a GPU is there; else HostResource."""
    mem = _engine.memory
    if pinned is None:
        pinned = torch.cuda.is_available()
    return mem.PinnedHostResource() if pinned else mem.HostResource()


class HostTier:
    """Flat host buffers by kind ("master", "optim_states", "staging", ...)."""

    def __init__(
        self,
        limit_bytes: int | None = None,
        pinned: bool | None = None,
        kinds: tuple[str, ...] = (),
    ):
        mem = _engine.memory
        upstream = host_resource(pinned)
        self.pinned = isinstance(upstream, mem.PinnedHostResource)
        if limit_bytes is not None:
            upstream = mem.LimitingAdaptor(upstream, limit_bytes)
        self.limit_bytes = limit_bytes
        self._upstream = upstream
        self._stats: dict[str, _engine.memory.StatisticsAdaptor] = {}
        for kind in kinds:
            self._adaptor(kind)

    def _adaptor(self, kind: str) -> _engine.memory.StatisticsAdaptor:
        if kind not in self._stats:
            self._stats[kind] = _engine.memory.StatisticsAdaptor(self._upstream)
        return self._stats[kind]

    def empty(self, kind: str, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A 1-D host tensor of `numel` elements, 4096-aligned, counted under `kind`;
        its memory goes back to the engine when the last view of it dies."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(numel, 1) * itemsize
        try:
            buf = self._adaptor(kind).allocate(nbytes, ALIGNMENT)
        except MemoryError as e:
            raise MemoryError(
                f"megalith_offload: {nbytes} bytes of host memory for {kind} do not fit "
                f"(host budget {self.limit_bytes} bytes, {self.current_bytes} in use): {e}"
            ) from e
        return torch.from_dlpack(buf.view(_ENGINE_DTYPE[dtype], numel))

    def zeros(self, kind: str, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.empty(kind, numel, dtype).zero_()

    @property
    def current_bytes(self) -> int:
        return sum(int(s.current_bytes) for s in self._stats.values())

    def report(self) -> dict[str, tuple[int, int]]:
        """(current, peak) bytes per kind, from the engine's adaptors."""
        return {k: (int(s.current_bytes), int(s.peak_bytes)) for k, s in self._stats.items()}

    def reset_peak(self) -> None:
        for s in self._stats.values():
            s.reset_peak()
