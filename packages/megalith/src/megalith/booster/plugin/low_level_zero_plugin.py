"""ColossalAI's module path colossalai.booster.plugin.low_level_zero_plugin: LowLevelZeroPlugin lives in zero.py."""

from .zero import LowLevelZeroPlugin

__all__ = ["LowLevelZeroPlugin"]
