"""The update rule of the user's optimizer, applied by the engine to flat fp32 shards.

megalith_zero keeps the user's optimizer object for its param groups (so learning
rate schedulers keep working on it) but never calls its step(): the rule below
reads the group's current hyperparameters and makes one fused engine call over
all shard segments that share a step number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from megalith_core.optim import functional as F

Tensors = Sequence[torch.Tensor]


@dataclass(frozen=True)
class Rule:
    kind: str  # "adam", "sgd" or "lion"
    decoupled_default: bool

    def state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        if self.kind == "adam":
            return (
                ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
                if group.get("amsgrad")
                else ("exp_avg", "exp_avg_sq")
            )
        if self.kind == "sgd":
            return ("momentum_buffer",) if group.get("momentum", 0.0) else ()
        return ("exp_avg",)

    def apply(
        self,
        group: dict[str, Any],
        step: int,
        params: Tensors,
        grads: Tensors,
        states: dict[str, list[torch.Tensor]],
        copies: Tensors | None,
        grad_scale: float,
    ) -> None:
        """One engine call; `step` is the step number being taken (1 for the first)."""
        common = dict(
            param_copies=copies, grad_scale=grad_scale, maximize=bool(group.get("maximize", False))
        )
        if self.kind == "adam":
            amsgrad = bool(group.get("amsgrad", False))
            F.adam_step(
                params,
                grads,
                states["exp_avg"],
                states["exp_avg_sq"],
                max_exp_avg_sqs=states["max_exp_avg_sq"] if amsgrad else None,
                step=step,
                lr=float(group["lr"]),
                betas=tuple(group["betas"]),
                eps=float(group["eps"]),
                weight_decay=float(group["weight_decay"]),
                decoupled_weight_decay=bool(
                    group.get("decoupled_weight_decay", self.decoupled_default)
                ),
                amsgrad=amsgrad,
                bias_correction=bool(group.get("bias_correction", True)),
                **common,
            )
        elif self.kind == "sgd":
            momentum = float(group.get("momentum", 0.0))
            F.sgd_step(
                params,
                grads,
                states["momentum_buffer"] if momentum else None,
                first_step=step == 1,
                lr=float(group["lr"]),
                momentum=momentum,
                dampening=float(group.get("dampening", 0.0)),
                weight_decay=float(group.get("weight_decay", 0.0)),
                nesterov=bool(group.get("nesterov", False)),
                **common,
            )
        else:
            F.lion_step(
                params,
                grads,
                states["exp_avg"],
                step=step,
                lr=float(group["lr"]),
                betas=tuple(group["betas"]),
                weight_decay=float(group.get("weight_decay", 0.0)),
                **common,
            )


def rule_for(optimizer: torch.optim.Optimizer) -> Rule:
    """The rule of a torch or megalith Adam/AdamW, SGD or Lion; a clear error otherwise."""
    from megalith_core.optim.adam import _EngineAdam
    from megalith_core.optim.lion import _EngineLion
    from megalith_core.optim.sgd import _EngineSGD

    if isinstance(optimizer, torch.optim.AdamW):
        return Rule("adam", True)
    if isinstance(optimizer, torch.optim.Adam):
        return Rule("adam", False)
    if isinstance(optimizer, _EngineAdam):
        return Rule("adam", optimizer.defaults["decoupled_weight_decay"])
    if isinstance(optimizer, (torch.optim.SGD, _EngineSGD)):
        return Rule("sgd", False)
    if isinstance(optimizer, _EngineLion):
        return Rule("lion", False)
    raise ValueError(
        f"megalith_zero: {type(optimizer).__name__} is not supported; ZeRO steps the shards with the "
        "engine's fused Adam/AdamW, SGD or Lion. Pass torch.optim.Adam/AdamW/SGD or megalith.optim's "
        "HybridAdam/FusedAdam/CPUAdam, *SGD or *Lion."
    )


def check_group(group: dict[str, Any], index: int) -> None:
    for key in ("capturable", "differentiable"):
        if group.get(key):
            raise ValueError(f"megalith_zero: param group {index} sets {key}=True; not supported")
