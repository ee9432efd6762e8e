"""NpuAccelerator: ColossalAI's Ascend NPU accelerator, which megalith does not have."""

from __future__ import annotations

from typing import Any


class NpuAccelerator:
    """Refused: megalith runs on NVIDIA GPUs (NCCL) and CPU ranks (Gloo) only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "NpuAccelerator: megalith has no Ascend NPU support (torch_npu/HCCL); run on "
            "NVIDIA GPUs or CPU ranks: get_accelerator() picks cuda when a GPU is visible, "
            "else cpu, or call set_accelerator('cuda') / set_accelerator('cpu')"
        )

    @staticmethod
    def is_available() -> bool:
        return False
