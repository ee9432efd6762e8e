"""CudaAccelerator: torch.cuda under ColossalAI's accelerator names (NCCL communication)."""

from __future__ import annotations

import os
from typing import Any

import torch

from .base import BaseAccelerator


def _default_index(count: int) -> int:
    """This rank's GPU: megalith_comm's local rank, else torch.distributed's rank, else
    LOCAL_RANK, each modulo the GPU count (ColossalAI's rule)."""
    import megalith_comm

    if megalith_comm.is_initialized():
        return megalith_comm.get_world().local_rank % count
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() % count
    raw = os.environ.get("LOCAL_RANK")
    if raw is not None and raw.strip().isdigit():
        return int(raw) % count
    raise RuntimeError(
        "get_accelerator().set_device(): no device given and the process group is not "
        "initialized; pass the device (set_device(local_rank)) or call megalith.launch first"
    )


class CudaAccelerator(BaseAccelerator):
    """Accelerator for NVIDIA GPUs."""

    def __init__(self) -> None:
        super().__init__(name="cuda", communication_backend="nccl", is_synchronous=False)

    # -- device --------------------------------------------------------------
    def get_version(self) -> str:
        return torch.version.cuda or ""

    def get_current_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def set_device(self, device: torch.device | int | None = None) -> None:
        if device is None:
            device = _default_index(self.device_count())
        torch.cuda.set_device(device)

    def get_device_name(self, device: torch.device | int | None = None) -> str:
        return torch.cuda.get_device_name(device)

    def synchronize(self, device: torch.device | int | None = None) -> None:
        torch.cuda.synchronize(device)

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        return torch.cuda.get_device_capability(device)

    def get_device_properties(self, device: Any = None) -> Any:
        return torch.cuda.get_device_properties(device)

    def utilization(self, device: Any = None) -> int:
        return torch.cuda.utilization(device)

    # -- random numbers --------------------------------------------------------
    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        return torch.cuda.get_rng_state(device if device is not None else "cuda")

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return torch.cuda.get_rng_state_all()

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
        torch.cuda.set_rng_state(new_state, device if device is not None else "cuda")

    def set_rng_state_all(self, new_states: list[torch.Tensor]) -> None:
        torch.cuda.set_rng_state_all(new_states)

    def manual_seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    def seed(self) -> None:
        torch.cuda.seed()

    def seed_all(self) -> None:
        torch.cuda.seed_all()

    def initial_seed(self) -> int:
        return torch.cuda.initial_seed()

    # -- memory ----------------------------------------------------------------
    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def memory_stats(self, device: Any = None) -> dict[str, Any]:
        return torch.cuda.memory_stats(device=device)

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        return torch.cuda.memory_summary(device=device, abbreviated=abbreviated)

    def memory_snapshot(self) -> Any:
        return torch.cuda.memory_snapshot()

    def memory_allocated(self, device: Any = None) -> int:
        return torch.cuda.memory_allocated(device=device)

    def max_memory_allocated(self, device: Any = None) -> int:
        return torch.cuda.max_memory_allocated(device=device)

    def reset_max_memory_allocated(self, device: Any = None) -> None:
        torch.cuda.reset_peak_memory_stats(device=device)

    def reset_max_memory_cached(self, device: Any = None) -> None:
        torch.cuda.reset_peak_memory_stats(device=device)

    def memory_reserved(self, device: Any = None) -> int:
        return torch.cuda.memory_reserved(device=device)

    def max_memory_reserved(self, device: Any = None) -> int:
        return torch.cuda.max_memory_reserved(device=device)

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        torch.cuda.set_per_process_memory_fraction(fraction, device=device)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        torch.cuda.reset_peak_memory_stats(device=device)

    # -- streams and events ----------------------------------------------------
    def Stream(self, device: Any = None, priority: int = 0, **kwargs: Any) -> Any:
        return torch.cuda.Stream(device, priority, **kwargs)

    def Event(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Any:
        return torch.cuda.Event(enable_timing, blocking, interprocess)

    def current_stream(self, device: Any = None) -> Any:
        return torch.cuda.current_stream(device)

    def default_stream(self, device: Any = None) -> Any:
        return torch.cuda.default_stream(device)

    def set_stream(self, stream_: Any) -> None:
        torch.cuda.set_stream(stream_)

    def stream(self, stream_: Any) -> Any:
        return torch.cuda.stream(stream_)

    # -- mixed precision -------------------------------------------------------
    def autocast(
        self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True
    ) -> Any:
        return torch.autocast(
            device_type="cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled
        )
