"""Adafactor (Shazeer and Stern, 2018, "Adafactor: Adaptive Learning Rates with
Sublinear Memory Cost"), in plain torch, with ColossalAI's (transformers') arguments.

At step t, for a parameter X with gradient G (computed in fp32):
    rho_t = lr, or with relative_step min(1e-2, 1/sqrt(t)) (min(1e-6 t, 1/sqrt(t)) with
            warmup_init);  alpha_t = rho_t * max(eps[1], RMS(X)) with scale_parameter,
            rho_t otherwise
    beta2_t = 1 - t^decay_rate
    matrices (ndim >= 2), factored over the last two dimensions:
        R = beta2_t R + (1 - beta2_t) mean_cols(G^2 + eps[0])
        C = beta2_t C + (1 - beta2_t) mean_rows(G^2 + eps[0])
        V = R C / mean(R)
    vectors: V = beta2_t V + (1 - beta2_t) (G^2 + eps[0])
    U = G / sqrt(V);  U /= max(1, RMS(U) / clip_threshold);  U *= alpha_t
    with beta1: M = beta1 M + (1 - beta1) U; U = M
    X -= weight_decay * alpha_t * X;  X -= U

This is the paper's rule (and transformers'). ColossalAI's copy differs in two ways
megalith does not follow: it drops a manual `lr` (always relative steps) and never
updates RMS(X), so its scale is eps[1]. A manual lr with relative_step=True is ignored
with a warning (the paper's relative step wins), as ColossalAI ignores it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ._common import ParamsT, next_step, params_with_grads, rms, run_closure, warn_ignored


def factored_rsqrt(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(R C / mean(R)) from the row and column statistics."""
    r = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
    return r * col.unsqueeze(-2).rsqrt()


def update_factored(
    state: dict[str, Any], prefix: str, value: torch.Tensor, beta: float
) -> torch.Tensor:
    """EMA of `value`'s row and column means in state[prefix + '_row'/'_col']
    (made on first use); returns 1 / sqrt of their rank-1 product."""
    row_key, col_key = prefix + "_row", prefix + "_col"
    if row_key not in state:
        state[row_key] = torch.zeros(value.shape[:-1], dtype=torch.float32, device=value.device)
        state[col_key] = torch.zeros(
            value.shape[:-2] + value.shape[-1:], dtype=torch.float32, device=value.device
        )
    row, col = state[row_key], state[col_key]
    row.mul_(beta).add_(value.mean(dim=-1), alpha=1 - beta)
    col.mul_(beta).add_(value.mean(dim=-2), alpha=1 - beta)
    return factored_rsqrt(row, col)


def update_full(state: dict[str, Any], key: str, value: torch.Tensor, beta: float) -> torch.Tensor:
    if key not in state:
        state[key] = torch.zeros_like(value, dtype=torch.float32)
    v = state[key]
    v.mul_(beta).add_(value, alpha=1 - beta)
    return v.rsqrt()


class Adafactor(torch.optim.Optimizer):
    """ColossalAI's Adafactor(params, lr, eps, clip_threshold, decay_rate, beta1,
    weight_decay, scale_parameter, relative_step, warmup_init)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
    ) -> None:
        owner = type(self).__name__
        if warmup_init and not relative_step:
            raise ValueError(f"{owner}: warmup_init=True needs relative_step=True")
        if lr is not None and relative_step:
            warn_ignored(
                owner,
                f"lr={lr}",
                "relative_step=True sets the step size (min(1e-2, 1/sqrt(t))); pass "
                "relative_step=False to use a fixed lr",
            )
            lr = None
        if lr is None and not relative_step:
            raise ValueError(f"{owner}: relative_step=False needs lr; pass lr=...")
        if beta1 is not None and not 0.0 <= beta1 < 1.0:
            raise ValueError(f"{owner}: invalid beta1 {beta1}; expected 0 <= beta1 < 1")
        defaults = dict(
            lr=lr,
            eps=tuple(eps),
            clip_threshold=clip_threshold,
            decay_rate=decay_rate,
            beta1=beta1,
            weight_decay=weight_decay,
            scale_parameter=scale_parameter,
            relative_step=relative_step,
            warmup_init=warmup_init,
        )
        super().__init__(params, defaults)

    @staticmethod
    def step_size(group: dict[str, Any], t: int, param_rms: float) -> float:
        rho = group["lr"]
        if group["relative_step"]:
            floor = 1e-6 * t if group["warmup_init"] else 1e-2
            rho = min(floor, 1.0 / math.sqrt(t))
        if group["scale_parameter"]:
            return max(group["eps"][1], param_rms) * rho
        return rho

    # GaLore's variant projects the gradient before and the update after (galore.py)
    def _project(self, group: dict[str, Any], state: dict[str, Any], g: torch.Tensor, t: int):
        return g

    def _project_back(
        self, group: dict[str, Any], state: dict[str, Any], u: torch.Tensor, shape: torch.Size
    ):
        return u

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = run_closure(closure)
        for group, _, p in params_with_grads(self):
            state = self.state[p]
            before = int(state["step"]) if "step" in state else 0
            g = self._project(group, state, p.grad.float(), before)
            t = next_step(state)
            w = p.float()
            alpha = self.step_size(group, t, float(rms(w)))
            beta2 = 1.0 - math.pow(t, group["decay_rate"])
            sq = g * g + group["eps"][0]
            if g.dim() >= 2:
                u = update_factored(state, "exp_avg_sq", sq, beta2) * g
            else:
                u = update_full(state, "exp_avg_sq", sq, beta2) * g
            u.div_((rms(u) / group["clip_threshold"]).clamp(min=1.0))
            u.mul_(alpha)
            if group["beta1"] is not None:
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(u)
                state["exp_avg"].mul_(group["beta1"]).add_(u, alpha=1 - group["beta1"])
                u = state["exp_avg"]
            u = self._project_back(group, state, u, p.shape)
            if group["weight_decay"] != 0:
                w.mul_(1 - group["weight_decay"] * alpha)
            w.sub_(u)
            p.copy_(w)
        return loss
