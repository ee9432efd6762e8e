"""megalith.accelerator: ColossalAI's device-neutral accelerator API.

    from megalith.accelerator import get_accelerator
    acc = get_accelerator()            # CudaAccelerator with a GPU, else CpuAccelerator
    x = torch.randn(4, device=acc.get_current_device())
    acc.synchronize(); peak = acc.max_memory_allocated()

On CPU ranks every method has a CPU meaning (cpu.py says which), so a GPU script
runs there unchanged.
"""

from .api import auto_set_accelerator, get_accelerator, set_accelerator
from .base import BaseAccelerator
from .cpu import CpuAccelerator, CpuEvent, CpuStream
from .cuda import CudaAccelerator
from .npu import NpuAccelerator

__all__ = [
    "BaseAccelerator",
    "CpuAccelerator",
    "CpuEvent",
    "CpuStream",
    "CudaAccelerator",
    "NpuAccelerator",
    "auto_set_accelerator",
    "get_accelerator",
    "set_accelerator",
]
