"""CAME (Luo et al., 2023, "CAME: Confidence-guided Adaptive Memory Efficient
Optimization"), in plain torch, with ColossalAI's arguments.

For a parameter X with gradient G (fp32), betas (b1, b2, b3), eps (e1, e2):
    V: Adafactor's second moment of G^2 + e1 with b2 (factored for ndim >= 2)
    U = G / sqrt(V);  U /= max(1, RMS(U) / clip_threshold)
    M = b1 M + (1 - b1) U
    matrices: S = the factored EMA (b3) of (U - M)^2 + e2;  step = M / sqrt(S)
    vectors: step = M
    X -= weight_decay * lr * X;  X -= lr * step
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._common import ParamsT, next_step, params_with_grads, rms, run_closure
from .adafactor import update_factored, update_full


class CAME(torch.optim.Optimizer):
    """ColossalAI's CAME(params, lr, eps, clip_threshold, betas, weight_decay); lr is
    required (ColossalAI asserts lr > 0)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-16),
        clip_threshold: float = 1.0,
        betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        weight_decay: float = 0.0,
    ) -> None:
        owner = type(self).__name__
        if lr is None or not lr > 0.0:
            raise ValueError(f"{owner}: lr={lr}; CAME needs a learning rate > 0 (pass lr=...)")
        if len(betas) != 3 or not all(0.0 <= b <= 1.0 for b in betas):
            raise ValueError(f"{owner}: betas={betas}; expected three numbers in [0, 1]")
        defaults = dict(
            lr=lr,
            eps=tuple(eps),
            clip_threshold=clip_threshold,
            betas=tuple(betas),
            weight_decay=weight_decay,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = run_closure(closure)
        for group, _, p in params_with_grads(self):
            state = self.state[p]
            next_step(state)
            b1, b2, b3 = group["betas"]
            e1, e2 = group["eps"]
            g = p.grad.float()
            factored = g.dim() >= 2
            sq = g * g + e1
            if factored:
                u = update_factored(state, "exp_avg_sq", sq, b2) * g
            else:
                u = update_full(state, "exp_avg_sq", sq, b2) * g
            u.div_((rms(u) / group["clip_threshold"]).clamp(min=1.0))
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(u)
            m = state["exp_avg"]
            m.mul_(b1).add_(u, alpha=1 - b1)
            if factored:
                res = (u - m).square_().add_(e2)
                update = update_factored(state, "exp_avg_res", res, b3) * m
            else:
                update = m.clone()
            w = p.float()
            if group["weight_decay"] != 0:
                w.mul_(1 - group["weight_decay"] * group["lr"])
            w.sub_(update, alpha=group["lr"])
            p.copy_(w)
        return loss
