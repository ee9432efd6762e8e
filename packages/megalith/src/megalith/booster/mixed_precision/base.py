"""MixedPrecision: what a Booster's `mixed_precision` is (ColossalAI's base class).

Each one says its working precision (`precision`: "fp16", "bf16" or "fp32") and, for
fp16, its dynamic loss scale (`loss_scale`, a megalith_core LossScaleConfig); the
Booster hands both to a plugin that does not set its own precision. configure()
also works on its own: it wraps a model to run its forward under autocast and an
optimizer to scale the loss, unscale the gradients and skip steps that overflow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from megalith_core.loss_scale import LossScaleConfig

PRECISIONS = ("fp16", "bf16", "fp32")


class MixedPrecision:
    #: the working precision the Booster gives the plugin
    precision: str = "fp32"
    #: fp16's dynamic loss scale (None: no loss scaling)
    loss_scale: LossScaleConfig | None = None

    @property
    def dtype(self) -> torch.dtype:
        return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[
            self.precision
        ]

    def configure(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        criterion: Callable | None = None,
    ) -> tuple[torch.nn.Module, Any, Callable | None]:
        """(model, optimizer, criterion) wrapped for this precision: forward (and the
        criterion) under autocast, the optimizer with loss scaling for fp16."""
        from .amp import AMPModule, AMPOptimizer

        if self.precision == "fp32":
            return model, optimizer, criterion
        model = AMPModule(model, self.dtype)
        if optimizer is not None:
            optimizer = AMPOptimizer(optimizer, self.loss_scale)
        if criterion is not None:
            criterion = AMPModule(criterion, self.dtype)
        return model, optimizer, criterion

    def __repr__(self) -> str:
        return f"{type(self).__name__}(precision={self.precision!r}, loss_scale={self.loss_scale})"
