"""LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning: Training BERT
in 76 minutes"), in ColossalAI's two forms, in plain torch on any device.

Lamb (ColossalAI's, after pytorch-lamb), per parameter p with gradient g:
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    r = m / (sqrt(v) + eps) + weight_decay * p
    trust = ||p|| / ||r||   (1 when either norm is 0, or adam=True)
    p -= lr_t * trust * r,  lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t) with
    bias_correction (default off: the paper's v3 has no debiasing), lr otherwise.

FusedLAMB (apex's multi_tensor_lamb):
    gradients are first divided by max(1, ||all gradients|| / max_grad_norm)
    (max_grad_norm <= 0: no clipping); with adam_w_mode=False, g += weight_decay * p;
    m = b1 m + b3 g (b3 = 1 - b1 with grad_averaging, 1 otherwise);
    v = b2 v + (1 - b2) g^2;
    u = (m / bc1) / (sqrt(v / bc2) + eps) (bc = 1 - b^t with bias_correction, 1 otherwise),
    plus weight_decay * p with adam_w_mode;
    p -= lr * ||p|| / ||u|| * u where weight_decay != 0 or use_nvlamb (ratio 1 when
    either norm is 0), p -= lr * u otherwise.

State per parameter: 'step', 'exp_avg', 'exp_avg_sq' (torch's Adam names).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._common import (
    ParamsT,
    check_betas,
    check_nonnegative,
    next_step,
    params_with_grads,
    run_closure,
)


def _moments(state: dict[str, Any], p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if "exp_avg" not in state:
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return state["exp_avg"], state["exp_avg_sq"]


def _ratio(w_norm: torch.Tensor, u_norm: torch.Tensor) -> torch.Tensor:
    ok = (w_norm > 0) & (u_norm > 0)
    return torch.where(ok, w_norm / torch.where(ok, u_norm, 1.0), 1.0)


class Lamb(torch.optim.Optimizer):
    """ColossalAI's Lamb(params, lr, betas, eps, weight_decay, adam, bias_correction)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
        bias_correction: bool = False,
    ) -> None:
        owner = type(self).__name__
        check_nonnegative(owner, lr=lr, eps=eps, weight_decay=weight_decay)
        defaults = dict(
            lr=lr,
            betas=check_betas(owner, betas),
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            adam=adam,
        )
        self.adam = adam
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = run_closure(closure)
        for group, _, p in params_with_grads(self):
            state = self.state[p]
            t = next_step(state)
            m, v = _moments(state, p)
            b1, b2 = group["betas"]
            g = p.grad.to(m.dtype)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            lr = group["lr"]
            if group["bias_correction"]:
                lr = lr * (1 - b2**t) ** 0.5 / (1 - b1**t)
            r = m / v.sqrt().add_(group["eps"])
            w = p.to(r.dtype)
            if group["weight_decay"] != 0:
                r.add_(w, alpha=group["weight_decay"])
            if group.get("adam", self.adam):
                trust = torch.ones((), dtype=r.dtype, device=r.device)
            else:
                trust = _ratio(torch.linalg.vector_norm(w), torch.linalg.vector_norm(r))
            p.sub_((r * (trust * lr)).to(p.dtype))
        return loss


class FusedLAMB(torch.optim.Optimizer):
    """ColossalAI's FusedLAMB(params, lr, bias_correction, betas, eps, weight_decay,
    amsgrad, adam_w_mode, grad_averaging, set_grad_none, max_grad_norm, use_nvlamb),
    apex's update computed in plain torch. amsgrad=True is refused, as in ColossalAI."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        adam_w_mode: bool = True,
        grad_averaging: bool = True,
        set_grad_none: bool = True,
        max_grad_norm: float = 1.0,
        use_nvlamb: bool = False,
    ) -> None:
        owner = type(self).__name__
        if amsgrad:
            raise NotImplementedError(
                f"{owner}: amsgrad=True is not supported (nor in ColossalAI's FusedLAMB); "
                "pass amsgrad=False"
            )
        check_nonnegative(owner, lr=lr, eps=eps, weight_decay=weight_decay)
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=check_betas(owner, betas),
            eps=eps,
            weight_decay=weight_decay,
            grad_averaging=grad_averaging,
            max_grad_norm=max_grad_norm,
        )
        super().__init__(params, defaults)
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none
        self.use_nvlamb = use_nvlamb

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    def _clip_divisor(self, params: list[torch.Tensor]) -> torch.Tensor | float:
        max_norm = float(self.defaults["max_grad_norm"])
        if max_norm <= 0 or not params:
            return 1.0
        norms = [torch.linalg.vector_norm(p.grad.float()).to(params[0].device) for p in params]
        total = torch.linalg.vector_norm(torch.stack(norms))
        return torch.clamp(total / max_norm, min=1.0)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = run_closure(closure)
        todo = list(params_with_grads(self))
        divisor = self._clip_divisor([p for _, _, p in todo])
        for group, _, p in todo:
            state = self.state[p]
            t = next_step(state)
            m, v = _moments(state, p)
            b1, b2 = group["betas"]
            wd = group["weight_decay"]
            w = p.to(m.dtype)
            g = p.grad.to(m.dtype) / (divisor.to(m.device) if torch.is_tensor(divisor) else divisor)
            if not self.adam_w_mode and wd != 0:
                g = g.add(w, alpha=wd)
            m.mul_(b1).add_(g, alpha=(1 - b1) if group["grad_averaging"] else 1.0)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            bc1 = 1 - b1**t if group["bias_correction"] else 1.0
            bc2 = 1 - b2**t if group["bias_correction"] else 1.0
            u = (m / bc1) / (v / bc2).sqrt().add_(group["eps"])
            if self.adam_w_mode and wd != 0:
                u.add_(w, alpha=wd)
            if self.use_nvlamb or wd != 0:
                ratio = _ratio(torch.linalg.vector_norm(w), torch.linalg.vector_norm(u))
            else:
                ratio = torch.ones((), dtype=u.dtype, device=u.device)
            p.sub_((u * (ratio * group["lr"])).to(p.dtype))
        return loss
