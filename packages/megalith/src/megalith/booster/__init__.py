"""megalith.booster: ColossalAI's Booster API (boost, backward, no_sync, checkpoints) on megalith."""

from .booster import Booster, launch_from_torch
from .plugin import (
    AutoPlugin,
    GeminiPlugin,
    HybridParallelPlugin,
    LowLevelZeroPlugin,
    Plugin,
    TorchDDPPlugin,
)
from .plugin.checkpointing import GradientCheckpointConfig

__all__ = [
    "AutoPlugin",
    "Booster",
    "GeminiPlugin",
    "GradientCheckpointConfig",
    "HybridParallelPlugin",
    "LowLevelZeroPlugin",
    "Plugin",
    "TorchDDPPlugin",
    "launch_from_torch",
]
