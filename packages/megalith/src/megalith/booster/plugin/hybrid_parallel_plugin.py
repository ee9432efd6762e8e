"""ColossalAI's module path colossalai.booster.plugin.hybrid_parallel_plugin.

HybridParallelModule / HybridParallelNaiveOptimizer are megalith's boosted model and
zero_stage 0 optimizer under ColossalAI's names (with fp16 the same optimizer scales
the loss: HybridParallelAMPOptimizer); under ZeRO the optimizer is zero.py's."""

from __future__ import annotations

from .hybrid import HybridModel as HybridParallelModule
from .hybrid import HybridParallelPlugin
from .hybrid_optimizer import HybridOptimizer as HybridParallelAMPOptimizer
from .hybrid_optimizer import HybridOptimizer as HybridParallelNaiveOptimizer
from .pp_plugin_base import PipelinePluginBase

__all__ = [
    "HybridParallelAMPOptimizer",
    "HybridParallelModule",
    "HybridParallelNaiveOptimizer",
    "HybridParallelPlugin",
    "PipelinePluginBase",
]
