"""Shared machinery of megalith's torch.optim.Optimizer subclasses.

A step groups the parameters of each param group into buckets that one engine
call can take (same device, same gradient dtype, same step number) and makes
one fused call per bucket: no per-tensor Python arithmetic, no temporaries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

ParamsT = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


class EngineOptimizer(torch.optim.Optimizer):
    #: device types this optimizer steps ("cpu", "cuda"); set by subclasses.
    devices: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda"})
    #: what to suggest when a parameter is on another device
    other_device_hint: ClassVar[str] = ""

    # -- subclasses -------------------------------------------------------
    def _init_state(self, p: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        raise NotImplementedError

    def _bucket_key(self, state: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _step_bucket(
        self, group: dict[str, Any], params: list[torch.Tensor], key: Any, grad_scale: float
    ) -> bool:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------
    def _check_param(self, p: torch.Tensor, index: int, group: dict[str, Any]) -> None:
        name = type(self).__name__
        if p.device.type not in self.devices:
            raise ValueError(
                f"{name}: parameter {index} (shape {list(p.shape)}) is on {p.device}; {name} steps "
                f"{' and '.join(sorted(self.devices))} parameters. {self.other_device_hint}"
            )
        self._check_dtype(p, index, group)
        g = p.grad
        if g.is_sparse:
            raise ValueError(f"{name}: parameter {index} has a sparse gradient; not supported")
        if not p.is_contiguous() or not g.is_contiguous():
            raise ValueError(
                f"{name}: parameter {index} or its gradient is not contiguous; the fused kernels "
                "need contiguous memory (use .contiguous() on the parameter data)"
            )

    def _check_dtype(self, p: torch.Tensor, index: int, group: dict[str, Any]) -> None:
        name = type(self).__name__
        if p.dtype != torch.float32:
            raise TypeError(
                f"{name}: parameter {index} (shape {list(p.shape)}) is {p.dtype}; the engine keeps "
                "fp32 parameters and optimizer states. Keep the model in fp32 and use autocast, or "
                "let megalith_zero's mixed precision hold bf16/fp16 copies."
            )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, div_scale: float = -1.0) -> Any:
        """One fused update of every parameter that has a gradient.

        div_scale: when > 0, gradients are divided by it in the same pass
        (ColossalAI's argument: the loss scale to undo).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = 1.0 / div_scale if div_scale > 0 else 1.0
        index = 0
        for group in self.param_groups:
            buckets: dict[Any, list[torch.Tensor]] = {}
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                self._check_param(p, index - 1, group)
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state, group)
                key = (p.device, p.grad.dtype, self._bucket_key(state))
                buckets.setdefault(key, []).append(p)
            for (_, _, key), params in buckets.items():
                self._step_bucket(group, params, key, grad_scale)
        return loss


def increment_steps(states: list[dict[str, Any]]) -> None:
    """Adds one to each state's 'step' tensor in one op (torch keeps it per parameter)."""
    torch._foreach_add_([s["step"] for s in states], 1.0)


def new_step_tensor() -> torch.Tensor:
    """torch.optim's layout: a float32 scalar on the CPU."""
    return torch.tensor(0.0, dtype=torch.float32)
