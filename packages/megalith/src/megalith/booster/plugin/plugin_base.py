"""ColossalAI's module path colossalai.booster.plugin.plugin_base: Plugin lives in base.py."""

from .base import Plugin

__all__ = ["Plugin"]
