"""What megalith's ColossalAI schedulers share.

[Note: schedulers on a boosted optimizer] torch's LRScheduler takes only a
torch.optim.Optimizer (torch 2.13 checks isinstance). A boosted optimizer (megalith's
OptimizerWrapper and its ZeRO/hybrid subclasses) is not one; it exposes the user's
optimizer's own `param_groups` list. `torch_optimizer` follows `.optim` / `.optimizer`
from the object given to the torch optimizer whose `param_groups` is that very list,
so a scheduler built on the boosted optimizer drives the same dicts the step reads
(and torch's "step before optimizer.step" check sees the optimizer that steps).

The warmup/annealing schedulers are closed forms of `last_epoch` (the number of
scheduler steps taken): the same values as ColossalAI's chained schedulers when
nothing else changes the learning rate, and a state_dict of plain numbers
(JSON-serialisable, as megalith's checkpoint I/O writes it).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

_warned: set[tuple[str, str]] = set()


def torch_optimizer(optimizer: Any, owner: str) -> torch.optim.Optimizer:
    """The torch optimizer whose param_groups `optimizer` exposes (see the Note)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(
            f"{owner}: {type(optimizer).__name__} is not an optimizer (it has no param_groups); "
            "pass the torch optimizer or the optimizer booster.boost returned"
        )
    inner, seen = optimizer, {id(optimizer)}
    while not isinstance(inner, torch.optim.Optimizer):
        step = None
        for attr in ("optim", "optimizer"):
            candidate = inner.__dict__.get(attr) if hasattr(inner, "__dict__") else None
            if candidate is not None and getattr(candidate, "param_groups", None) is groups:
                step = candidate
                break
        if step is None or id(step) in seen:
            raise TypeError(
                f"{owner}: {type(optimizer).__name__} is not a torch.optim.Optimizer and wraps "
                "none whose param_groups it exposes; build the scheduler on the torch optimizer "
                "you pass to booster.boost"
            )
        seen.add(id(step))
        inner = step
    return inner


def warn_ignored(owner: str, ignored: dict[str, Any], why: str) -> None:
    """warnings.warn once per (owner, argument) for keywords ColossalAI accepts and drops."""
    for name in ignored:
        if (owner, name) in _warned:
            continue
        _warned.add((owner, name))
        warnings.warn(f"{owner}: {name} is ignored: {why}", UserWarning, stacklevel=4)


def warmup_factor(step: int, warmup_steps: int) -> float:
    """ColossalAI's linear warmup: (step + 1) / warmup_steps of the base lr."""
    return (step + 1) / warmup_steps


def cosine(base: float, eta_min: float, t: int, period: int) -> float:
    """eta_min + (base - eta_min) (1 + cos(pi t / period)) / 2 (torch's closed form;
    period 0: the base lr)."""
    if period <= 0:
        return base
    return eta_min + (base - eta_min) * (1 + math.cos(math.pi * t / period)) / 2


class ClosedFormLR(LRScheduler):
    """A scheduler whose lr is a function of last_epoch and the group's base lr."""

    def __init__(self, optimizer: Any, last_epoch: int = -1) -> None:
        super().__init__(torch_optimizer(optimizer, type(self).__name__), last_epoch)

    def lr_at(self, step: int, base: float) -> float:
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        return [self.lr_at(self.last_epoch, base) for base in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float]:
        return self.get_lr()
