"""AMPModule and AMPOptimizer: autocast forward, and dynamic loss scaling for fp16.

The scaling follows torch.amp.GradScaler's rules (megalith_core.loss_scale; with
hysteresis 1 and no bounds a step-for-step match of GradScaler): backward scales
the loss; step (or a clip, first) unscales the gradients once, skips the update
when any of them is inf or nan, and moves the scale.
"""

from __future__ import annotations

from typing import Any

import torch

from megalith_core.loss_scale import DynamicLossScaler, LossScaleConfig

from ..wrappers import ModelWrapper, OptimizerWrapper


class AMPModule(ModelWrapper):
    """Runs the wrapped module (or loss function) under torch.autocast(dtype) on the
    device of its parameters (the accelerator's when it has none)."""

    def __init__(self, module: Any, dtype: torch.dtype = torch.float16) -> None:
        super().__init__(module)
        self.dtype = dtype

    def _device_type(self) -> str:
        params = self.module.parameters() if isinstance(self.module, torch.nn.Module) else ()
        first = next(iter(params), None)
        if first is not None:
            return first.device.type
        from megalith.accelerator import get_accelerator

        return get_accelerator().get_current_device().type

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self._device_type(), dtype=self.dtype):
            return self.module(*args, **kwargs)


class AMPOptimizer(OptimizerWrapper):
    """An optimizer with dynamic loss scaling (loss_scale None: plain, for bf16)."""

    def __init__(self, optim: torch.optim.Optimizer, loss_scale: LossScaleConfig | None) -> None:
        super().__init__(optim)
        self.scaler = DynamicLossScaler(loss_scale) if loss_scale is not None else None
        self._unscaled = False
        self._found_inf = False

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without scaling)."""
        return self.scaler.scale if self.scaler is not None else 1.0

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.optim.param_groups for p in g["params"]]

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scaler.scale if self.scaler is not None else loss

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.scale_loss(loss).backward(*args, **kwargs)

    def backward_by_grad(self, tensor: torch.Tensor, grad: torch.Tensor, **kwargs: Any) -> None:
        scale = self.scaler.scale if self.scaler is not None else 1.0
        torch.autograd.backward(tensor, grad * scale, **kwargs)

    def unscale_grad(self) -> None:
        """Divides the gradients by the scale (once per step) and notes an overflow."""
        if self.scaler is None or self._unscaled:
            return
        inv = 1.0 / self.scaler.scale
        found = False
        for p in self._params():
            if p.grad is not None:
                p.grad.mul_(inv)
                found = found or not bool(torch.isfinite(p.grad).all())
        self._found_inf, self._unscaled = found, True

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """The optimizer's step, skipped when a gradient overflowed; then the scale moves."""
        if self.scaler is None:
            return self.optim.step(*args, **kwargs)
        self.unscale_grad()
        out = None if self._found_inf else self.optim.step(*args, **kwargs)
        self.scaler.update(self._found_inf)
        self._unscaled = self._found_inf = False
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def clip_grad_by_norm(
        self,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Clips the unscaled gradients' total norm to max_norm; returns the norm before."""
        self.unscale_grad()
        return torch.nn.utils.clip_grad_norm_(
            self._params(), max_norm, norm_type, error_if_nonfinite=error_if_nonfinite
        )

    def clip_grad_by_value(self, clip_value: float, *args: Any, **kwargs: Any) -> None:
        self.unscale_grad()
        torch.nn.utils.clip_grad_value_(self._params(), clip_value)

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)
