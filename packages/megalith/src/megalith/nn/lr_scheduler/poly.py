"""Polynomial decay, with ColossalAI's warmup variant. With b the base lr, k the steps
taken, T total_steps:

    PolynomialLR:       (b - end_lr) (1 - min(k, T) / T)^power + end_lr
    PolynomialWarmupLR: (k + 1) / w * b for k < w, then PolynomialLR over T - w steps
"""

from __future__ import annotations

from typing import Any

from ._base import ClosedFormLR, warmup_factor, warn_ignored

_WHY = "ColossalAI's scheduler accepts and drops extra keywords too"


def _poly(base: float, end_lr: float, power: float, step: int, total: int) -> float:
    if total <= 0:
        return end_lr
    return (base - end_lr) * (1 - min(step, total) / total) ** power + end_lr


class PolynomialLR(ClosedFormLR):
    """ColossalAI's PolynomialLR(optimizer, total_steps, end_lr, power, last_epoch)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        end_lr: float = 0.0001,
        power: float = 1.0,
        last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:
        if end_lr < 0:
            raise ValueError(f"PolynomialLR: end_lr={end_lr}; expected >= 0")
        warn_ignored(type(self).__name__, kwargs, _WHY)
        self.total_steps, self.end_lr, self.power = total_steps, end_lr, power
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base: float) -> float:
        return _poly(base, self.end_lr, self.power, step, self.total_steps)


class PolynomialWarmupLR(ClosedFormLR):
    """ColossalAI's PolynomialWarmupLR(optimizer, total_steps, warmup_steps, end_lr,
    power, last_epoch)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        warmup_steps: int = 0,
        end_lr: float = 0.0001,
        power: float = 1.0,
        last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        if end_lr < 0:
            raise ValueError(f"{owner}: end_lr={end_lr}; expected >= 0")
        if warmup_steps < 0:
            raise ValueError(f"{owner}: warmup_steps={warmup_steps}; expected >= 0")
        warn_ignored(owner, kwargs, _WHY)
        self.total_steps, self.warmup_steps = total_steps, int(warmup_steps)
        self.end_lr, self.power = end_lr, power
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base: float) -> float:
        w = self.warmup_steps
        if step < w:
            return warmup_factor(step, w) * base
        return _poly(base, self.end_lr, self.power, step - w, self.total_steps - w)
