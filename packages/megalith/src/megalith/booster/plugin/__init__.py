"""Booster plugins. Names as strings: "ddp"/"gpu"/"torch_ddp", "zero1", "zero2"
(LowLevelZeroPlugin), "gemini"/"zero3" (GeminiPlugin), "auto" (AutoPlugin: the planner chooses)."""

from __future__ import annotations

from .auto_plugin import AutoPlugin
from .base import Plugin
from .dp_plugin_base import DPPluginBase
from .hybrid import HybridParallelPlugin
from .moe_hybrid_parallel_plugin import MoeHybridParallelPlugin
from .torch_ddp import TorchDDPPlugin
from .torch_fsdp import TorchFSDPPlugin
from .zero import GeminiPlugin, LowLevelZeroPlugin

NAMES = ("ddp", "gpu", "torch_ddp", "zero1", "zero2", "low_level_zero", "gemini", "zero3", "auto")


def plugin_from_name(name: str, precision: str | None = None) -> Plugin:
    key = name.lower().replace("-", "_")
    p = precision or "fp32"
    if key in ("ddp", "gpu", "torch_ddp"):
        plugin: Plugin = TorchDDPPlugin()
        plugin.set_precision(p)
        return plugin
    if key in ("zero1", "zero2", "low_level_zero"):
        return LowLevelZeroPlugin(stage=1 if key == "zero1" else 2, precision=p)
    if key in ("gemini", "zero3"):
        return GeminiPlugin(precision=p)
    if key == "auto":
        return AutoPlugin(precision=precision)
    raise ValueError(
        f"unknown plugin {name!r}; expected one of: {', '.join(NAMES)} (or a Plugin object)"
    )


__all__ = [
    "NAMES",
    "AutoPlugin",
    "DPPluginBase",
    "GeminiPlugin",
    "HybridParallelPlugin",
    "LowLevelZeroPlugin",
    "MoeHybridParallelPlugin",
    "Plugin",
    "TorchDDPPlugin",
    "TorchFSDPPlugin",
    "plugin_from_name",
]
