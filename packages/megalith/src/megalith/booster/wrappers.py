"""What Booster.boost returns: the model and optimizer, wrapped, with ColossalAI's surface."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class ModelWrapper(torch.nn.Module):
    """A boosted model. `unwrap()` gives the user's module (for saving, inspecting)."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def unwrap(self) -> torch.nn.Module:
        m = self.module
        while hasattr(m, "module") and isinstance(m.module, torch.nn.Module):
            m = m.module
        return m

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class OptimizerWrapper:
    """A boosted optimizer: backward(loss), step(), zero_grad(), clip_grad_by_norm(max_norm)."""

    def __init__(self, optim: Any):
        self.optim = optim

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return getattr(self.optim, "defaults", {})

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        loss.backward(*args, **kwargs)

    def step(self, *args: Any, **kwargs: Any) -> Any:
        return self.optim.step(*args, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def clip_grad_by_norm(self, max_norm: float, norm_type: float = 2.0) -> float:
        raise NotImplementedError

    def no_sync(self) -> Iterator[None]:
        raise NotImplementedError

    def unwrap(self) -> Any:
        return self.optim

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optim!r})"
