"""Step decay at milestones, with ColossalAI's warmup variant. With b the base lr and
k the steps taken:

    MultiStepLR:       b * gamma^(number of milestones <= k)   (torch's MultiStepLR rule)
    MultiStepWarmupLR: (k + 1) / w * b for k < w, then b * gamma^(number of
                       milestones m >= w with m - w <= k - w)
"""

from __future__ import annotations

import bisect
from typing import Any

from ._base import ClosedFormLR, warmup_factor, warn_ignored

_WHY = "ColossalAI's scheduler accepts and drops extra keywords too"


def _check_milestones(owner: str, milestones: list[int] | None) -> list[int]:
    if not milestones:
        raise ValueError(f"{owner}: milestones={milestones}; pass a non-empty list of steps")
    return sorted(int(m) for m in milestones)


class MultiStepLR(ClosedFormLR):
    """ColossalAI's MultiStepLR(optimizer, total_steps, milestones, gamma, last_epoch):
    torch's MultiStepLR rule as a closed form, so that its state_dict (milestones a
    sorted list, not torch's Counter) survives JSON."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        milestones: list[int] | None = None,
        gamma: float = 0.1,
        last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        warn_ignored(owner, kwargs, _WHY)
        self.total_steps, self.gamma = total_steps, gamma
        self.milestones = _check_milestones(owner, milestones)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base: float) -> float:
        return base * self.gamma ** bisect.bisect_right(self.milestones, step)


class MultiStepWarmupLR(ClosedFormLR):
    """ColossalAI's MultiStepWarmupLR(optimizer, total_steps, warmup_steps, milestones,
    gamma, last_epoch)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        warmup_steps: int = 0,
        milestones: list[int] | None = None,
        gamma: float = 0.1,
        last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        warn_ignored(owner, kwargs, _WHY)
        if warmup_steps < 0:
            raise ValueError(f"{owner}: warmup_steps={warmup_steps}; expected >= 0")
        self.total_steps, self.warmup_steps, self.gamma = total_steps, int(warmup_steps), gamma
        self.milestones = _check_milestones(owner, milestones)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base: float) -> float:
        w = self.warmup_steps
        if step < w:
            return warmup_factor(step, w) * base
        shifted = [m - w for m in self.milestones if m >= w]
        return base * self.gamma ** bisect.bisect_right(shifted, step - w)
