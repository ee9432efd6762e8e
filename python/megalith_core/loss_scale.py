"""Dynamic loss scaling for fp16 training (torch.amp.GradScaler's rules): the
configuration and the scaler every optimizer wrapper above the floor shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LossScaleConfig:
    """Dynamic loss scaling for fp16 (ignored for bf16/fp32).

    The scale starts at `initial`; a step whose gradients hold inf/nan is
    skipped and the scale multiplied by `backoff`; after `growth_interval`
    clean steps in a row it is multiplied by `growth` (up to `max_scale`).
    These are torch.amp.GradScaler's rules and defaults, so a run can be
    compared step for step with one.
    """

    initial: float = 2.0**16
    growth: float = 2.0
    backoff: float = 0.5
    growth_interval: int = 2000
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    #: overflows in a row before the scale backs off (ColossalAI's/DeepSpeed's
    #: "hysteresis"; 1 is GradScaler's rule). A clean growth interval resets it.
    hysteresis: int = 1

    def __post_init__(self) -> None:
        if not self.initial > 0:
            raise ValueError(f"LossScaleConfig: initial={self.initial}; expected > 0")
        if not self.growth > 1:
            raise ValueError(f"LossScaleConfig: growth={self.growth}; expected > 1")
        if not 0 < self.backoff < 1:
            raise ValueError(f"LossScaleConfig: backoff={self.backoff}; expected 0 < backoff < 1")
        if self.hysteresis < 1:
            raise ValueError(f"LossScaleConfig: hysteresis={self.hysteresis}; expected >= 1")
        if self.growth_interval < 1:
            raise ValueError(
                f"LossScaleConfig: growth_interval={self.growth_interval}; expected >= 1"
            )
        if not 0 < self.min_scale <= self.initial <= self.max_scale:
            raise ValueError(
                f"LossScaleConfig: expected 0 < min_scale ({self.min_scale}) <= initial "
                f"({self.initial}) <= max_scale ({self.max_scale})"
            )


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
