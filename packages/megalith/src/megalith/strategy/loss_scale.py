"""Each plugin's default dynamic loss scale, in ColossalAI's argument names."""

from __future__ import annotations

from megalith_core.loss_scale import LossScaleConfig


def colossal_loss_scale(
    initial_scale: float = 2**16,
    min_scale: float = 1,
    growth_factor: float = 2,
    backoff_factor: float = 0.5,
    growth_interval: int = 1000,
    hysteresis: int = 2,
    max_scale: float = 2**32,
) -> LossScaleConfig:
    """LossScaleConfig from the arguments ColossalAI's plugins take (and their defaults)."""
    return LossScaleConfig(
        initial=float(initial_scale),
        min_scale=float(min_scale),
        growth=float(growth_factor),
        backoff=float(backoff_factor),
        growth_interval=int(growth_interval),
        hysteresis=int(hysteresis),
        max_scale=float(max_scale),
    )


def default_loss_scale(plugin: str) -> LossScaleConfig:
    """What the plugin scales fp16 losses with when it is not told: torch's GradScaler for
    ddp, ColossalAI's defaults for the others (LowLevelZeroPlugin starts at 2**32)."""
    if plugin == "ddp":
        return LossScaleConfig()
    if plugin in ("zero1", "zero2"):
        return colossal_loss_scale(initial_scale=2**32)
    return colossal_loss_scale()
