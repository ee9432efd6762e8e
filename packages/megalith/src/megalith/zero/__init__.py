"""ColossalAI's colossalai.zero names. The boosted objects of the ZeRO plugins are these
classes (isinstance checks hold): LowLevelZeroOptimizer (LowLevelZeroPlugin), GeminiDDP
and GeminiOptimizer (GeminiPlugin). megalith builds them through the Booster only;
building one directly, or through ColossalAI's wrapper functions, raises and names the
Booster call that does it. get_static_torch_model gives a plain torch copy of a Gemini
model with its full values.
"""

from __future__ import annotations

from typing import Any

from megalith.booster.plugin.gemini_model import GeminiDDP
from megalith.booster.plugin.zero_optimizers import GeminiOptimizer, LowLevelZeroOptimizer

from .static_model import get_static_torch_model


def _through_booster(what: str, plugin: str) -> Any:
    raise TypeError(
        f"{what}: megalith builds ZeRO models and optimizers through the Booster: "
        f"Booster(plugin={plugin}(...)).boost(model, optimizer)"
    )


class GeminiAdamOptimizer(GeminiOptimizer):
    """ColossalAI's GeminiOptimizer over a HybridAdam built for you; refused as GeminiOptimizer."""

    _plugin = "GeminiPlugin"


def zero_model_wrapper(model: Any, zero_stage: int = 1, gemini_config: Any = None, **_: Any) -> Any:
    plugin = "GeminiPlugin" if zero_stage == 3 else "LowLevelZeroPlugin"
    return _through_booster("zero_model_wrapper", plugin)


def zero_optim_wrapper(model: Any, optimizer: Any, **_: Any) -> Any:
    return _through_booster("zero_optim_wrapper", "LowLevelZeroPlugin or GeminiPlugin")


__all__ = [
    "GeminiAdamOptimizer",
    "GeminiDDP",
    "GeminiOptimizer",
    "LowLevelZeroOptimizer",
    "get_static_torch_model",
    "zero_model_wrapper",
    "zero_optim_wrapper",
]
