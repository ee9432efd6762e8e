"""Dynamic loss scaling for fp16 training (torch.amp.GradScaler's rules)."""

from __future__ import annotations

from typing import Any

from .config import LossScaleConfig


class DynamicLossScaler:
    def __init__(self, config: LossScaleConfig):
        self.config = config
        self.scale = float(config.initial)
        self.clean_steps = 0
        self.overflows = 0  # since the last back-off or growth

    def update(self, found_inf: bool) -> None:
        c = self.config
        if found_inf:
            self.clean_steps = 0
            self.overflows += 1
            if self.overflows >= c.hysteresis:
                self.scale = max(self.scale * c.backoff, c.min_scale)
                self.overflows = 0
            return
        self.clean_steps += 1
        if self.clean_steps == c.growth_interval:
            self.scale = min(self.scale * c.growth, c.max_scale)
            self.clean_steps = 0
            self.overflows = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "overflows": self.overflows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.overflows = int(state.get("overflows", 0))
