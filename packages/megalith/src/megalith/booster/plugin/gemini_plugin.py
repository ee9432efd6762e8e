"""ColossalAI's module path colossalai.booster.plugin.gemini_plugin: GeminiPlugin lives in zero.py."""

from .zero import GeminiPlugin

__all__ = ["GeminiPlugin"]
