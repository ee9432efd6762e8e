"""ColossalAI's LinearWarmupLR: with b the base lr, k the steps taken, w warmup_steps,
T total_steps:

    (k + 1) / (w + 1) * b   for k < w
    (T - k) / (T - w) * b   after, down to 0 at k = T

Past T megalith holds 0, where ColossalAI's formula turns negative.
"""

from __future__ import annotations

from typing import Any

from ._base import ClosedFormLR, warn_ignored


class LinearWarmupLR(ClosedFormLR):
    """ColossalAI's LinearWarmupLR(optimizer, total_steps, warmup_steps, last_epoch)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        warmup_steps: int = 0,
        last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"LinearWarmupLR: warmup_steps={warmup_steps}, total_steps={total_steps}; "
                "expected 0 <= warmup_steps < total_steps"
            )
        warn_ignored(type(self).__name__, kwargs, "ColossalAI's LinearWarmupLR drops it too")
        self.total_steps, self.warmup_steps = total_steps, warmup_steps
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base: float) -> float:
        w, t = self.warmup_steps, self.total_steps
        if step < w:
            return (step + 1) / (w + 1) * base
        return max(0.0, (t - step) / (t - w)) * base
