"""SGD on the engine's fused kernels, with torch.optim.SGD's arguments,
semantics and state_dict layout (per-parameter 'momentum_buffer')."""

from __future__ import annotations

from typing import Any

import torch

from ._base import EngineOptimizer, ParamsT
from .functional import sgd_step


class _EngineSGD(EngineOptimizer):
    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        name = type(self).__name__
        if lr < 0.0 or momentum < 0.0 or weight_decay < 0.0:
            raise ValueError(
                f"{name}: lr ({lr}), momentum ({momentum}) and weight_decay ({weight_decay}) must be >= 0"
            )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                f"{name}: nesterov needs momentum > 0 and dampening == 0 (got {momentum}, {dampening})"
            )
        if differentiable:
            raise ValueError(f"{name}: differentiable=True is not supported; use torch.optim.SGD")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            foreach=None,
            differentiable=False,
            fused=None,
        )
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)
            group.setdefault("maximize", False)

    def _init_state(self, p: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        pass  # the momentum buffer is made on the first step, like torch's

    def _bucket_key(self, state: dict[str, Any]) -> Any:
        return state.get("momentum_buffer") is None  # first step with momentum

    def _step_bucket(
        self, group: dict[str, Any], params: list[torch.Tensor], first: bool, grad_scale: float
    ) -> bool:
        momentum = group["momentum"]
        buffers = None
        if momentum != 0.0:
            if first:
                for p in params:
                    self.state[p]["momentum_buffer"] = torch.empty_like(
                        p, memory_format=torch.preserve_format
                    )
            buffers = [self.state[p]["momentum_buffer"] for p in params]
        return sgd_step(
            params,
            [p.grad for p in params],
            buffers,
            first_step=first,
            lr=float(group["lr"]),
            momentum=momentum,
            dampening=group["dampening"],
            weight_decay=group["weight_decay"],
            nesterov=group["nesterov"],
            maximize=group["maximize"],
            grad_scale=grad_scale,
        )


class CPUSGD(_EngineSGD):
    """SGD for host parameters."""

    devices = frozenset({"cpu"})
    other_device_hint = "Use HybridSGD for a mix of CPU and GPU parameters, or FusedSGD on the GPU."


class FusedSGD(_EngineSGD):
    """SGD for GPU parameters: one multi-tensor launch per group."""

    devices = frozenset({"cuda"})
    other_device_hint = "Use CPUSGD for host parameters, or HybridSGD for a mix."


class HybridSGD(_EngineSGD):
    """SGD over CPU and GPU parameters in one step()."""

    devices = frozenset({"cpu", "cuda"})
