"""One door for configuration: megalith.strategy.Strategy, the frozen, self-checking
description of a run's parallelism, precision, offloading, loss scaling and clipping
that `megalith train`, `megalith plan` and the Booster's plugins are made from."""

from __future__ import annotations

from .loss_scale import colossal_loss_scale, default_loss_scale
from .strategy import PLUGINS, Parallel, Strategy, ZeroTuning

__all__ = [
    "PLUGINS",
    "Parallel",
    "Strategy",
    "ZeroTuning",
    "colossal_loss_scale",
    "default_loss_scale",
]
