"""ColossalAI's colossalai.booster.accelerator.Accelerator: a device a model is moved to.

    model = Accelerator("cpu").configure_model(model)

Booster places models itself (each rank's device); this is the small helper ColossalAI
scripts and tests import by this path. megalith.accelerator is the device API proper.
"""

from __future__ import annotations

import torch

__all__ = ["Accelerator"]

_DEVICES = ("cpu", "cuda")


class Accelerator:
    """Device "cpu" or "cuda"; bind() makes it the current device, configure_model moves a model."""

    def __init__(self, device: str) -> None:
        if device not in _DEVICES:
            raise ValueError(
                f"Accelerator(device={device!r}): expected one of {list(_DEVICES)}; for other "
                "devices use megalith.accelerator.get_accelerator()"
            )
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("Accelerator('cuda'): no CUDA GPU is visible here; pass 'cpu'")
        self.device = device

    def bind(self) -> None:
        if self.device == "cuda":
            torch.cuda.set_device(torch.cuda.current_device())

    def configure_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(torch.device(self.device))
