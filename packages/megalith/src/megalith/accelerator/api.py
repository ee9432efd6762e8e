"""The process's accelerator: get_accelerator, set_accelerator, auto_set_accelerator."""

from __future__ import annotations

from .base import BaseAccelerator
from .cpu import CpuAccelerator
from .cuda import CudaAccelerator
from .npu import NpuAccelerator

__all__ = ["auto_set_accelerator", "get_accelerator", "set_accelerator"]

# In the order auto_set_accelerator tries them.
_MAPPING: dict[str, type] = {"cuda": CudaAccelerator, "npu": NpuAccelerator, "cpu": CpuAccelerator}
_ACCELERATOR: BaseAccelerator | None = None


def set_accelerator(accelerator: str | BaseAccelerator) -> None:
    """Sets the process's accelerator: "cuda", "cpu", or an accelerator object."""
    global _ACCELERATOR
    if isinstance(accelerator, str):
        if accelerator not in _MAPPING:
            raise ValueError(
                f"set_accelerator({accelerator!r}): expected one of {', '.join(_MAPPING)} "
                "or a BaseAccelerator"
            )
        made = _MAPPING[accelerator]()
        if accelerator == "cuda" and not made.is_available():
            raise RuntimeError(
                "set_accelerator('cuda'): no CUDA GPU is visible to this process; "
                "use set_accelerator('cpu') (or get_accelerator(), which picks)"
            )
        _ACCELERATOR = made
    elif isinstance(accelerator, BaseAccelerator):
        _ACCELERATOR = accelerator
    else:
        raise TypeError(
            "accelerator must be a name ('cuda', 'cpu') or a BaseAccelerator, got "
            f"{type(accelerator).__name__}"
        )


def auto_set_accelerator() -> None:
    """Sets the first available accelerator: cuda when a GPU is visible, else cpu."""
    global _ACCELERATOR
    cuda = CudaAccelerator()
    _ACCELERATOR = cuda if cuda.is_available() else CpuAccelerator()


def get_accelerator() -> BaseAccelerator:
    """The process's accelerator, chosen by auto_set_accelerator on first use."""
    if _ACCELERATOR is None:
        auto_set_accelerator()
    if _ACCELERATOR is None:  # auto_set_accelerator always sets one; this guards a refactor
        raise RuntimeError("megalith.accelerator: no accelerator was set; call set_accelerator")
    return _ACCELERATOR
