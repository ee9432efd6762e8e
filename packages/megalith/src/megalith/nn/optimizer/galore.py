"""GaLore (Zhao et al., 2024, "GaLore: Memory-Efficient LLM Training by Gradient
Low-Rank Projection"): AdamW or Adafactor on low-rank projections of 2-D gradients.

Parameters in a param group that has "rank" (see get_galore_param_groups) are stepped
in a rank-r subspace: every update_proj_gap steps (counting from 0) the projection P
is recomputed from the SVD of the gradient G (m x n): with proj_type "std", the first
r right singular vectors when m >= n (R = G Vr^T, back: R Vr) and the first r left
ones otherwise (R = Ur^T G, back: Ur R); "reverse_std" swaps the two; "right"/"left"
fix the side; "full" uses both (R = Ur^T G Vr^T, back: Ur R Vr). The optimizer's
moments live in the projected shape, and the update is projected back and multiplied
by `scale`. Group defaults (ColossalAI's): update_proj_gap 200, scale 0.25,
proj_type "std". Other parameters are stepped by the plain algorithm.

GaLoreAdamW is galore_torch's (transformers' AdamW: eps 1e-6, correct_bias, decoupled
weight decay applied after the update); GaLoreAdafactor is megalith's Adafactor with
the projection. GaLoreAdamW8bit keeps 8-bit states with bitsandbytes, which megalith
does not build on: it is refused by name.
"""

from __future__ import annotations

import math
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
    warn_ignored,
)
from .adafactor import Adafactor

PROJ_TYPES = ("std", "reverse_std", "right", "left", "full")
_GROUP_DEFAULTS = {"update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}


def get_galore_param_groups(
    model: torch.nn.Module,
    weight_decay: float,
    rank: int = 256,
    update_proj_gap: int = 200,
    scale: float = 0.25,
    proj_type: str = "std",
) -> list[dict[str, Any]]:
    """ColossalAI's helper: 2-D weights in a GaLore group, other weights in a plain
    group, biases and LayerNorm weights in a group without weight decay."""
    galore, plain, no_decay = [], [], []
    for name, p in model.named_parameters():
        if "bias" in name or "LayerNorm.weight" in name:
            no_decay.append(p)
        elif p.dim() == 2:
            galore.append(p)
        else:
            plain.append(p)
    return [
        {
            "params": galore,
            "rank": rank,
            "update_proj_gap": update_proj_gap,
            "scale": scale,
            "proj_type": proj_type,
            "weight_decay": weight_decay,
        },
        {"params": plain, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _side(proj_type: str, shape: torch.Size) -> str:
    m, n = shape
    if proj_type == "std":
        return "right" if m >= n else "left"
    if proj_type == "reverse_std":
        return "left" if m >= n else "right"
    return proj_type


class _Projection:
    """The projection of one parameter, kept in its optimizer state ('ortho',
    and 'ortho_right' for "full") so that state_dict carries it."""

    def __init__(self, group: dict[str, Any], state: dict[str, Any]) -> None:
        self.group, self.state = group, state

    def project(self, g: torch.Tensor, step_before: int) -> torch.Tensor:
        group, state = self.group, self.state
        side = _side(group["proj_type"], g.shape)
        if "ortho" not in state or step_before % group["update_proj_gap"] == 0:
            u, _, vh = torch.linalg.svd(g.float(), full_matrices=False)
            r = group["rank"]
            if side == "right":
                state["ortho"] = vh[:r].contiguous()
            elif side == "left":
                state["ortho"] = u[:, :r].contiguous()
            else:
                state["ortho"], state["ortho_right"] = u[:, :r].contiguous(), vh[:r].contiguous()
        p = state["ortho"]
        if side == "right":
            return g @ p.t()
        if side == "left":
            return p.t() @ g
        return p.t() @ g @ state["ortho_right"].t()

    def back(self, low: torch.Tensor, full_shape: torch.Size) -> torch.Tensor:
        side = _side(self.group["proj_type"], full_shape)
        p = self.state["ortho"]
        if side == "right":
            full = low @ p
        elif side == "left":
            full = p @ low
        else:
            full = p @ low @ self.state["ortho_right"]
        return full * self.group["scale"]


def _prepare_groups(owner: str, optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        if "rank" not in group:
            continue
        for key, value in _GROUP_DEFAULTS.items():
            group.setdefault(key, value)
        if group["proj_type"] not in PROJ_TYPES:
            raise ValueError(
                f"{owner}: proj_type={group['proj_type']!r}; expected one of {PROJ_TYPES}"
            )
        if group.get("proj_quant"):
            raise NotImplementedError(
                f"{owner}: proj_quant=True (int4 projections) is not supported; leave it False"
            )


def _projection(owner: str, group: dict[str, Any], state: dict[str, Any], g: torch.Tensor):
    if "rank" not in group:
        return None
    if g.dim() != 2:
        warn_ignored(owner, "rank for a parameter that is not 2-D", "it is stepped unprojected")
        return None
    return _Projection(group, state)


class GaLoreAdamW(torch.optim.Optimizer):
    """galore_torch's GaLoreAdamW(params, lr, betas, eps, weight_decay, correct_bias,
    no_deprecation_warning)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        correct_bias: bool = True,
        no_deprecation_warning: bool = False,
    ) -> None:
        owner = type(self).__name__
        check_nonnegative(owner, lr=lr, eps=eps)
        defaults = dict(
            lr=lr,
            betas=check_betas(owner, betas),
            eps=eps,
            weight_decay=weight_decay,
            correct_bias=correct_bias,
        )
        super().__init__(params, defaults)
        _prepare_groups(owner, self)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = run_closure(closure)
        owner = type(self).__name__
        for group, _, p in params_with_grads(self):
            state = self.state[p]
            before = int(state["step"]) if "step" in state else 0
            g = p.grad.float()
            proj = _projection(owner, group, state, g)
            if proj is not None:
                g = proj.project(g, before)
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(g)
                state["exp_avg_sq"] = torch.zeros_like(g)
            m, v = state["exp_avg"], state["exp_avg_sq"]
            t = next_step(state)
            b1, b2 = group["betas"]
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            size = group["lr"]
            if group["correct_bias"]:
                size = size * math.sqrt(1 - b2**t) / (1 - b1**t)
            u = m / v.sqrt().add_(group["eps"])
            if proj is not None:
                u = proj.back(u, p.shape)
            w = p.float()
            w.sub_(u, alpha=size)
            if group["weight_decay"] > 0:
                w.mul_(1 - group["lr"] * group["weight_decay"])
            p.copy_(w)
        return loss


class GaLoreAdafactor(Adafactor):
    """galore_torch's GaLoreAdafactor: Adafactor's arguments; 2-D parameters of groups
    with "rank" are stepped on projected gradients."""

    def __init__(self, params: ParamsT, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        _prepare_groups(type(self).__name__, self)

    def _project(self, group, state, g, t):
        proj = _projection(type(self).__name__, group, state, g)
        return g if proj is None else proj.project(g, t)

    def _project_back(self, group, state, u, shape):
        if "rank" not in group or len(shape) != 2:
            return u
        return _Projection(group, state).back(u, shape)


_BNB_FIX = (
    "install bitsandbytes (pip install bitsandbytes) for 8-bit optimizer states, or use "
    "megalith.nn.optimizer.GaLoreAdamW (the same projection, 32-bit AdamW states)"
)


class GaLoreAdamW8bit(torch.optim.Optimizer):
    """ColossalAI's GaLoreAdamW8bit(params, lr, betas, eps, weight_decay, nbits,
    min_8bit_size, percentile_clipping, block_wise, is_paged, args): GaLore over
    bitsandbytes' 8-bit AdamW. Refused: megalith does not build on bitsandbytes."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        nbits: int = 8,
        min_8bit_size: int = 4096,
        percentile_clipping: int = 100,
        block_wise: bool = True,
        is_paged: bool = False,
        args: Any = None,
    ) -> None:
        refuse_8bit(type(self).__name__)


def refuse_8bit(owner: str) -> None:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ImportError(
            f"{owner} needs bitsandbytes, which is not installed: {_BNB_FIX}"
        ) from None
    raise NotImplementedError(
        f"{owner}: megalith does not step bitsandbytes' 8-bit states; use "
        "megalith.nn.optimizer.GaLoreAdamW (the same projection, 32-bit AdamW states), or "
        "bitsandbytes' own optimizers without megalith's ZeRO"
    )
