"""BaseAccelerator: ColossalAI's device-neutral API (device, RNG, memory, streams, autocast).

A script written against `get_accelerator()` runs unchanged on a GPU and on CPU
ranks; each subclass says what every method means on its device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class BaseAccelerator(ABC):
    #: whether set_device binds the process to one device (launch calls it when True)
    support_set_device: bool = True

    def __init__(self, name: str, communication_backend: str, is_synchronous: bool) -> None:
        self._name = name
        self._communication_backend = communication_backend
        self._is_synchronous = is_synchronous

    @property
    def name(self) -> str:
        """ "cuda" or "cpu"."""
        return self._name

    @property
    def communication_backend(self) -> str:
        """The library tensors on this device are communicated through ("nccl", "gloo")."""
        return self._communication_backend

    @property
    def is_synchronous(self) -> bool:
        """Whether work on this device finishes before the call that issued it returns."""
        return self._is_synchronous

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self._name}, communication_backend="
            f"{self._communication_backend}, is_synchronous={self._is_synchronous})"
        )

    def set_to_device(self, models: Any) -> Any:
        """Moves a module (or each of a list of modules) to the current device; a list of
        one gives the module itself back, as ColossalAI does."""
        device = self.get_current_device()
        if isinstance(models, list):
            moved = [m.to(device) for m in models]
            return moved[0] if len(moved) == 1 else moved
        return models.to(device)

    # -- device --------------------------------------------------------------
    @abstractmethod
    def get_version(self) -> str: ...
    @abstractmethod
    def get_current_device(self) -> torch.device: ...
    @abstractmethod
    def current_device(self) -> int: ...
    @abstractmethod
    def set_device(self, device: torch.device | int | None = None) -> None: ...
    @abstractmethod
    def get_device_name(self, device: torch.device | int | None = None) -> str: ...
    @abstractmethod
    def synchronize(self, device: torch.device | int | None = None) -> None: ...
    @abstractmethod
    def is_available(self) -> bool: ...
    @abstractmethod
    def device_count(self) -> int: ...
    @abstractmethod
    def get_device_capability(self, device: Any = None) -> tuple[int, int]: ...
    @abstractmethod
    def get_device_properties(self, device: Any = None) -> Any: ...
    @abstractmethod
    def utilization(self, device: Any = None) -> int: ...

    # -- random numbers --------------------------------------------------------
    @abstractmethod
    def get_rng_state(self, device: Any = None) -> torch.Tensor: ...
    @abstractmethod
    def get_rng_state_all(self) -> list[torch.Tensor]: ...
    @abstractmethod
    def set_rng_state(self, new_state: torch.Tensor, device: Any = None) -> None: ...
    @abstractmethod
    def set_rng_state_all(self, new_states: list[torch.Tensor]) -> None: ...
    @abstractmethod
    def manual_seed(self, seed: int) -> None: ...
    @abstractmethod
    def manual_seed_all(self, seed: int) -> None: ...
    @abstractmethod
    def seed(self) -> None: ...
    @abstractmethod
    def seed_all(self) -> None: ...
    @abstractmethod
    def initial_seed(self) -> int: ...

    # -- memory ----------------------------------------------------------------
    @abstractmethod
    def empty_cache(self) -> None: ...
    @abstractmethod
    def memory_stats(self, device: Any = None) -> dict[str, Any]: ...
    @abstractmethod
    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str: ...
    @abstractmethod
    def memory_snapshot(self) -> Any: ...
    @abstractmethod
    def memory_allocated(self, device: Any = None) -> int: ...
    @abstractmethod
    def max_memory_allocated(self, device: Any = None) -> int: ...
    @abstractmethod
    def reset_max_memory_allocated(self, device: Any = None) -> None: ...
    @abstractmethod
    def reset_max_memory_cached(self, device: Any = None) -> None: ...
    @abstractmethod
    def memory_reserved(self, device: Any = None) -> int: ...
    @abstractmethod
    def max_memory_reserved(self, device: Any = None) -> int: ...
    @abstractmethod
    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None: ...
    @abstractmethod
    def reset_peak_memory_stats(self, device: Any = None) -> None: ...

    # -- streams and events ----------------------------------------------------
    @abstractmethod
    def Stream(self, device: Any = None, priority: int = 0, **kwargs: Any) -> Any: ...
    @abstractmethod
    def Event(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Any: ...
    @abstractmethod
    def current_stream(self, device: Any = None) -> Any: ...
    @abstractmethod
    def default_stream(self, device: Any = None) -> Any: ...
    @abstractmethod
    def set_stream(self, stream_: Any) -> None: ...
    @abstractmethod
    def stream(self, stream_: Any) -> Any: ...

    # -- mixed precision -------------------------------------------------------
    @abstractmethod
    def autocast(
        self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True
    ) -> Any:
        """A context manager running its body under torch.autocast on this device."""
