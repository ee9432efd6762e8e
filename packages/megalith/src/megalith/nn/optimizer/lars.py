"""LARS (You, Gitman and Ginsburg, 2017, "Large Batch Training of Convolutional
Networks") as ColossalAI has it, in plain torch. Per parameter w with gradient g:

    trust = eeta * ||w|| / (||g|| + weight_decay * ||w|| + epsilon), clamped to [0, 50]
            (1 when ||w|| or ||g|| is 0)
    d = clamp(g + weight_decay * w, -10, 10)
    b = d on the first step, momentum * b + d after   (momentum != 0; else b = d)
    w -= lr * trust * b

State per parameter: 'momentum_buffer' (with momentum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._common import ParamsT, check_nonnegative, params_with_grads, run_closure


class Lars(torch.optim.Optimizer):
    """ColossalAI's Lars(params, lr, momentum, eeta, weight_decay, epsilon)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        momentum: float = 0.0,
        eeta: float = 1e-3,
        weight_decay: float = 0.0,
        epsilon: float = 0.0,
    ) -> None:
        owner = type(self).__name__
        check_nonnegative(owner, lr=lr, momentum=momentum, weight_decay=weight_decay)
        check_nonnegative(owner, epsilon=epsilon)
        if not 0.0 < eeta <= 1.0:
            raise ValueError(f"{owner}: invalid eeta {eeta}; expected 0 < eeta <= 1")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            eeta=eeta,
            epsilon=epsilon,
            lars=True,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = run_closure(closure)
        for group, _, p in params_with_grads(self):
            wd, momentum = group["weight_decay"], group["momentum"]
            g = p.grad
            scale = torch.ones((), dtype=torch.float32, device=p.device)
            if group["lars"]:
                w_norm = torch.linalg.vector_norm(p.float())
                g_norm = torch.linalg.vector_norm(g.float())
                ok = (w_norm > 0) & (g_norm > 0)
                trust = group["eeta"] * w_norm / (g_norm + wd * w_norm + group["epsilon"])
                scale = torch.where(ok, trust, scale).clamp(0.0, 50.0)
                if wd != 0:
                    g = g.add(p, alpha=wd)
            d = g.clamp(-10.0, 10.0)
            if momentum != 0:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = d.clone()
                else:
                    state["momentum_buffer"].mul_(momentum).add_(d)
                d = state["momentum_buffer"]
            p.sub_((d * (scale * group["lr"])).to(p.dtype))
        return loss
