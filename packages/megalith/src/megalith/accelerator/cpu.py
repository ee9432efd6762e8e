"""CpuAccelerator: the accelerator of CPU ranks (no CUDA GPU visible).

Where ColossalAI's CPU accelerator raises for most methods, this one gives each a
CPU meaning, so that a GPU script runs on CPU ranks unchanged: the device is
`cpu` (index 0, one device), synchronize and empty_cache have nothing to wait for
or free, seeds go to torch's CPU generator, memory figures are this process's
resident set and its peak as the OS reports them (host_memory.py), streams and
events are host-side objects whose timing is wall-clock, and autocast is torch's
CPU autocast. Only what has no CPU meaning (a CUDA compute capability, device
properties, utilization) raises, naming what to check instead.
"""

from __future__ import annotations

import contextlib
import platform
import resource
import time
from collections.abc import Iterator
from typing import Any

import torch

from . import host_memory
from .base import BaseAccelerator


def _no_cuda(what: str) -> RuntimeError:
    return RuntimeError(
        f"get_accelerator().{what} has no meaning on CPU ranks (no CUDA GPU is visible); "
        "check get_accelerator().name == 'cuda' before asking for it"
    )


def _check_cpu(device: Any) -> None:
    if device is None or device == 0:
        return
    if torch.device(device).type != "cpu":
        raise ValueError(
            f"CpuAccelerator: device={device!r}; this rank runs on CPU (no CUDA GPU is visible), "
            "so pass None or 'cpu'"
        )


class CpuEvent:
    """An event on the host: record() notes the time; CPU work is done when issued, so
    query() is True and synchronize()/wait() return at once. elapsed_time in ms."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self._at: float | None = None

    def record(self, stream: Any = None) -> None:
        self._at = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def elapsed_time(self, end_event: CpuEvent) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("elapsed_time needs both events made with enable_timing=True")
        if self._at is None or end_event._at is None:
            raise RuntimeError("elapsed_time: record() both events first")
        return (end_event._at - self._at) * 1000.0


class CpuStream:
    """A stream on the host: work runs in program order, so waits have nothing to wait for."""

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        _check_cpu(device)
        self.device = torch.device("cpu")
        self.priority = priority

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        event = event or CpuEvent()
        event.record(self)
        return event


class CpuAccelerator(BaseAccelerator):
    """Accelerator for CPU ranks (Gloo communication)."""

    support_set_device: bool = False

    def __init__(self) -> None:
        super().__init__(name="cpu", communication_backend="gloo", is_synchronous=False)
        self._default_stream = CpuStream()
        self._stream = self._default_stream

    # -- device --------------------------------------------------------------
    def get_version(self) -> str:
        return ""  # torch is not built against a device toolkit for CPU

    def get_current_device(self) -> torch.device:
        return torch.device("cpu")

    def current_device(self) -> int:
        return 0

    def set_device(self, device: torch.device | int | None = None) -> None:
        _check_cpu(device)

    def get_device_name(self, device: torch.device | int | None = None) -> str:
        _check_cpu(device)
        return platform.processor() or platform.machine() or "cpu"

    def synchronize(self, device: torch.device | int | None = None) -> None:
        _check_cpu(device)

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        raise _no_cuda("get_device_capability()")

    def get_device_properties(self, device: Any = None) -> Any:
        raise _no_cuda("get_device_properties()")

    def utilization(self, device: Any = None) -> int:
        raise _no_cuda("utilization()")

    # -- random numbers --------------------------------------------------------
    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [torch.get_rng_state()]

    def set_rng_state(self, new_state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(new_state)

    def set_rng_state_all(self, new_states: list[torch.Tensor]) -> None:
        if len(new_states) != 1:
            raise ValueError(f"set_rng_state_all: CPU is one device; got {len(new_states)} states")
        torch.set_rng_state(new_states[0])

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def seed(self) -> None:
        torch.seed()

    def seed_all(self) -> None:
        torch.seed()

    def initial_seed(self) -> int:
        return torch.initial_seed()

    # -- memory: this process's resident set (there is no CPU caching allocator) --
    def empty_cache(self) -> None:
        pass

    def memory_stats(self, device: Any = None) -> dict[str, Any]:
        now, peak = host_memory.rss(), host_memory.peak_rss()
        return {
            "allocated_bytes.all.current": now,
            "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": now,
            "reserved_bytes.all.peak": peak,
        }

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        mib = 2.0**20
        return (
            f"CPU process memory: resident {host_memory.rss() / mib:.1f} MiB, "
            f"peak {host_memory.peak_rss() / mib:.1f} MiB, machine {host_memory.total() / mib:.0f} MiB"
        )

    def memory_snapshot(self) -> list[Any]:
        return []  # no allocator segments on CPU

    def memory_allocated(self, device: Any = None) -> int:
        return host_memory.rss()

    def max_memory_allocated(self, device: Any = None) -> int:
        return host_memory.peak_rss()

    def reset_max_memory_allocated(self, device: Any = None) -> None:
        host_memory.reset_peak()

    def reset_max_memory_cached(self, device: Any = None) -> None:
        host_memory.reset_peak()

    def memory_reserved(self, device: Any = None) -> int:
        return host_memory.rss()

    def max_memory_reserved(self, device: Any = None) -> int:
        return host_memory.peak_rss()

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        """Caps this process's address space at fraction x the machine's memory
        (RLIMIT_AS, as ColossalAI does); allocations past it raise MemoryError."""
        if not 0 < fraction <= 1:
            raise ValueError(
                f"set_per_process_memory_fraction: fraction={fraction}; expected (0, 1]"
            )
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = int(host_memory.total() * fraction)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        host_memory.reset_peak()

    # -- streams and events ----------------------------------------------------
    def Stream(self, device: Any = None, priority: int = 0, **kwargs: Any) -> CpuStream:
        return CpuStream(device, priority)

    def Event(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> CpuEvent:
        return CpuEvent(enable_timing)

    def current_stream(self, device: Any = None) -> CpuStream:
        _check_cpu(device)
        return self._stream

    def default_stream(self, device: Any = None) -> CpuStream:
        _check_cpu(device)
        return self._default_stream

    def set_stream(self, stream_: Any) -> None:
        self._stream = stream_ if stream_ is not None else self._default_stream

    @contextlib.contextmanager
    def stream(self, stream_: Any) -> Iterator[None]:
        before = self._stream
        self.set_stream(stream_)
        try:
            yield
        finally:
            self._stream = before

    # -- mixed precision -------------------------------------------------------
    def autocast(
        self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True
    ) -> Any:
        """torch's CPU autocast (float16 or bfloat16)."""
        return torch.autocast(
            device_type="cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled
        )
