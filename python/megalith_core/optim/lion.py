"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms") on
the engine's fused kernels. State per parameter: 'step' and 'exp_avg'."""

from __future__ import annotations

from typing import Any

import torch

from ._base import EngineOptimizer, ParamsT, increment_steps, new_step_tensor
from .functional import lion_step


class _EngineLion(EngineOptimizer):
    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
    ) -> None:
        name = type(self).__name__
        if lr < 0.0 or weight_decay < 0.0:
            raise ValueError(f"{name}: lr ({lr}) and weight_decay ({weight_decay}) must be >= 0")
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"{name}: invalid beta{i + 1} {b}; expected 0 <= beta < 1")
        super().__init__(
            params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, maximize=maximize)
        )

    def _init_state(self, p: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = new_step_tensor()
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _bucket_key(self, state: dict[str, Any]) -> Any:
        return None  # Lion has no bias correction: every parameter steps together

    def _step_bucket(
        self, group: dict[str, Any], params: list[torch.Tensor], key: Any, grad_scale: float
    ) -> bool:
        states = [self.state[p] for p in params]
        found = lion_step(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            step=1,
            lr=float(group["lr"]),
            betas=group["betas"],
            weight_decay=group["weight_decay"],
            maximize=group["maximize"],
            grad_scale=grad_scale,
        )
        increment_steps(states)
        return found


class CPULion(_EngineLion):
    """Lion for host parameters."""

    devices = frozenset({"cpu"})
    other_device_hint = (
        "Use HybridLion for a mix of CPU and GPU parameters, or FusedLion on the GPU."
    )


class FusedLion(_EngineLion):
    """Lion for GPU parameters."""

    devices = frozenset({"cuda"})
    other_device_hint = "Use CPULion for host parameters, or HybridLion for a mix."


class HybridLion(_EngineLion):
    """Lion over CPU and GPU parameters in one step()."""

    devices = frozenset({"cpu", "cuda"})
