"""GeminiDDP: GeminiPlugin's boosted model (ColossalAI's name), its parameters ColoParameters.

Every parameter of the model is a view of a ZeRO stage-3 chunk (megalith_zero), and is
marked as such: the same Parameter objects, their class changed to ColoParameter, so
isinstance(p, ColoParameter) holds as under ColossalAI and nothing that holds them
(optimizer groups, hooks, chunk views) sees a new object.
"""

from __future__ import annotations

from typing import Any

from megalith.tensor import as_colo_parameters

from .zero_wrappers import ZeroModelWrapper


class GeminiDDP(ZeroModelWrapper):
    def __init__(self, module: Any, force_outputs_fp32: bool = False, file_layout: Any = None):
        if not hasattr(module, "chunks") or not hasattr(module, "stage3"):
            raise TypeError(
                "GeminiDDP(module, ...): megalith builds the Gemini model through the "
                "Booster: Booster(plugin=GeminiPlugin(...)).boost(module, optimizer) "
                "returns one"
            )
        super().__init__(module, force_outputs_fp32, file_layout)
        as_colo_parameters(module.module)
