"""Cosine annealing (Loshchilov and Hutter, 2016, "SGDR"), with ColossalAI's warmup
and flat variants. With b the base lr and k the number of scheduler steps taken:

    CosineAnnealingLR:       eta_min + (b - eta_min) (1 + cos(pi k / total_steps)) / 2
    CosineAnnealingWarmupLR: (k + 1) / w * b for k < w, then the cosine from b to
                             eta_min over total_steps - w steps (k - w of them taken)
    FlatAnnealingLR:         b for k < f = int(total_steps * pct_start), then the cosine
                             from b to 0 over total_steps - f steps
    FlatAnnealingWarmupLR:   warmup for k < w, b up to w + f (f = int((total_steps - w)
                             * pct_start)), then the cosine from b to eta_min over the rest
"""

from __future__ import annotations

from typing import Any

from torch.optim.lr_scheduler import CosineAnnealingLR as _TorchCosine

from ._base import ClosedFormLR, cosine, torch_optimizer, warmup_factor, warn_ignored

_KWARGS_WHY = "ColossalAI's scheduler accepts and drops extra keywords too"


def _check_pct(owner: str, pct_start: float) -> None:
    if not 0.0 <= pct_start <= 1.0:
        raise ValueError(f"{owner}: pct_start={pct_start}; expected 0 <= pct_start <= 1")


class CosineAnnealingLR(_TorchCosine):
    """ColossalAI's CosineAnnealingLR(optimizer, total_steps, eta_min, last_epoch)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        eta_min: float = 0.0,
        last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:
        warn_ignored(type(self).__name__, kwargs, _KWARGS_WHY)
        opt = torch_optimizer(optimizer, type(self).__name__)
        super().__init__(opt, total_steps, eta_min=eta_min, last_epoch=last_epoch)


class CosineAnnealingWarmupLR(ClosedFormLR):
    """ColossalAI's CosineAnnealingWarmupLR(optimizer, total_steps, warmup_steps,
    eta_min, last_epoch)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        warmup_steps: int = 0,
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"CosineAnnealingWarmupLR: warmup_steps={warmup_steps}, total_steps={total_steps}; "
                "expected 0 <= warmup_steps < total_steps"
            )
        self.total_steps, self.warmup_steps, self.eta_min = total_steps, int(warmup_steps), eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        # Without warmup, ColossalAI's scheduler is torch's chained cosine, whose first
        # value is the lr the group has now: a scheduler built on an optimizer that another
        # one has already stepped leaves its lr alone (its own tests rely on that).
        if self.last_epoch == 0 and self.warmup_steps == 0:
            return [group["lr"] for group in self.optimizer.param_groups]
        return super().get_lr()

    def lr_at(self, step: int, base: float) -> float:
        w = self.warmup_steps
        if step < w:
            return warmup_factor(step, w) * base
        return cosine(base, self.eta_min, step - w, self.total_steps - w)


class FlatAnnealingLR(ClosedFormLR):
    """ColossalAI's FlatAnnealingLR(optimizer, total_steps, pct_start, last_epoch)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        pct_start: float = 0.72,
        last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        _check_pct(owner, pct_start)
        warn_ignored(
            owner,
            kwargs,
            "ColossalAI's FlatAnnealingLR accepts and drops it too (anneals to 0); for a floor "
            "use FlatAnnealingWarmupLR(warmup_steps=0, eta_min=...)",
        )
        self.total_steps, self.pct_start = total_steps, pct_start
        self.flat_steps = int(total_steps * pct_start)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base: float) -> float:
        f = self.flat_steps
        if step < f:
            return base
        return cosine(base, 0.0, step - f, self.total_steps - f)


class FlatAnnealingWarmupLR(ClosedFormLR):
    """ColossalAI's FlatAnnealingWarmupLR(optimizer, total_steps, warmup_steps, pct_start,
    eta_min, last_epoch)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        warmup_steps: int = 0,
        pct_start: float = 0.72,
        eta_min: float = 0.0,
        last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        _check_pct(owner, pct_start)
        if warmup_steps < 0:
            raise ValueError(f"{owner}: warmup_steps={warmup_steps}; expected >= 0")
        warn_ignored(owner, kwargs, _KWARGS_WHY)
        self.total_steps, self.warmup_steps, self.eta_min = total_steps, warmup_steps, eta_min
        self.pct_start = pct_start
        self.flat_steps = int((total_steps - warmup_steps) * pct_start)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base: float) -> float:
        w, f = self.warmup_steps, self.flat_steps
        if step < w:
            return warmup_factor(step, w) * base
        if step < w + f:
            return base
        return cosine(base, self.eta_min, step - w - f, self.total_steps - w - f)
