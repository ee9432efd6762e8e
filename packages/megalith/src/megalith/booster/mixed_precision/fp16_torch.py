"""FP16TorchMixedPrecision: fp16 autocast with torch.amp.GradScaler's dynamic loss scale."""

from __future__ import annotations

from megalith_core.loss_scale import LossScaleConfig

from .amp import AMPModule, AMPOptimizer
from .base import MixedPrecision

__all__ = ["FP16TorchMixedPrecision", "TorchAMPModule", "TorchAMPOptimizer"]

# GradScaler has no floor or ceiling on its scale.
_UNBOUNDED = {"min_scale": float.fromhex("0x1p-126"), "max_scale": float("inf")}


class TorchAMPModule(AMPModule):
    """ColossalAI's name: a module run under fp16 autocast."""


class TorchAMPOptimizer(AMPOptimizer):
    """ColossalAI's name: an optimizer with GradScaler's dynamic loss scaling."""

    def __init__(
        self,
        optim,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        super().__init__(optim, _config(init_scale, growth_factor, backoff_factor, growth_interval))


def _config(init_scale, growth_factor, backoff_factor, growth_interval) -> LossScaleConfig:
    return LossScaleConfig(
        initial=float(init_scale),
        growth=float(growth_factor),
        backoff=float(backoff_factor),
        growth_interval=int(growth_interval),
        hysteresis=1,
        **_UNBOUNDED,
    )


class FP16TorchMixedPrecision(MixedPrecision):
    """fp16 forward under autocast; the loss scale starts at init_scale, is multiplied by
    backoff_factor on a step whose gradients overflow (the step is skipped) and by
    growth_factor after growth_interval clean steps (GradScaler's arguments and rules)."""

    precision = "fp16"

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        self.torch_amp_kwargs = dict(
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
        )
        self.loss_scale = _config(init_scale, growth_factor, backoff_factor, growth_interval)
