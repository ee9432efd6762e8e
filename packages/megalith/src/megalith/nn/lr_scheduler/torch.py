"""ColossalAI's wrappers of torch's schedulers: the same rule, and a leading
`total_steps` argument (taken and unused, as in ColossalAI)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.optim import lr_scheduler as _torch

from ._base import torch_optimizer

LambdaT = Callable[[int], float] | list[Callable[[int], float]]


def _check_lambda(owner: str, lr_lambda: LambdaT | None) -> LambdaT:
    if lr_lambda is None:
        raise ValueError(f"{owner}: lr_lambda=None; pass a function of the step (or one per group)")
    return lr_lambda


class LambdaLR(_torch.LambdaLR):
    """ColossalAI's LambdaLR(optimizer, total_steps, lr_lambda, last_epoch): b * f(k)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        lr_lambda: LambdaT | None = None,
        last_epoch: int = -1,
    ) -> None:
        owner = type(self).__name__
        fn = _check_lambda(owner, lr_lambda)
        super().__init__(torch_optimizer(optimizer, owner), fn, last_epoch=last_epoch)


class MultiplicativeLR(_torch.MultiplicativeLR):
    """ColossalAI's MultiplicativeLR(optimizer, total_steps, lr_lambda, last_epoch):
    lr_k = lr_(k-1) * f(k)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        lr_lambda: LambdaT | None = None,
        last_epoch: int = -1,
    ) -> None:
        owner = type(self).__name__
        fn = _check_lambda(owner, lr_lambda)
        super().__init__(torch_optimizer(optimizer, owner), fn, last_epoch=last_epoch)


class StepLR(_torch.StepLR):
    """ColossalAI's StepLR(optimizer, total_steps, step_size, gamma, last_epoch):
    b * gamma^(k // step_size)."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        step_size: int = 1,
        gamma: float = 0.1,
        last_epoch: int = -1,
    ) -> None:
        opt = torch_optimizer(optimizer, type(self).__name__)
        super().__init__(opt, step_size, gamma=gamma, last_epoch=last_epoch)


class ExponentialLR(_torch.ExponentialLR):
    """ColossalAI's ExponentialLR(optimizer, total_steps, gamma, last_epoch): b * gamma^k."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        gamma: float = 1.0,
        last_epoch: int = -1,
    ) -> None:
        opt = torch_optimizer(optimizer, type(self).__name__)
        super().__init__(opt, gamma, last_epoch=last_epoch)
