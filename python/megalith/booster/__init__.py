"""megalith.booster: ColossalAI's Booster API (boost, backward, no_sync, checkpoints) on megalith."""

from .booster import Booster, launch_from_torch
from .plugin import GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin, Plugin, TorchDDPPlugin

__all__ = [
    "Booster",
    "GeminiPlugin",
    "HybridParallelPlugin",
    "LowLevelZeroPlugin",
    "Plugin",
    "TorchDDPPlugin",
    "launch_from_torch",
]
