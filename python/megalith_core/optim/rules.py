"""What megalith knows of an optimizer class, in one place: its update rule.

A Rule gives, for the optimizers the engine can step (torch's and megalith's Adam,
AdamW, SGD, Lion, and any class registered with `register_rule`), the names of
its per-parameter states, the hyperparameters its param groups carry, and its
flat step: one fused engine call over many flat fp32 segments. megalith_zero steps
its shards with it (it keeps the user's optimizer object for its param groups, so
learning rate schedulers keep working, but never calls its step()), and checkpoint
I/O names and checks optimizer states by its `kind`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import functional as F
from . import lean_states
from .adam import _EngineAdam
from .lion import _EngineLion
from .sgd import _EngineSGD

Tensors = Sequence[torch.Tensor]

#: the param-group hyperparameters each kind of rule reads
HYPERPARAMETERS = {
    "adam": (
        "lr",
        "betas",
        "eps",
        "weight_decay",
        "amsgrad",
        "maximize",
        "decoupled_weight_decay",
        "bias_correction",
    ),
    "sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    "lion": ("lr", "betas", "weight_decay", "maximize"),
}


@dataclass(frozen=True)
class Rule:
    kind: str  # "adam", "sgd" or "lion"
    decoupled_default: bool = False

    def __post_init__(self) -> None:
        if self.kind not in HYPERPARAMETERS:
            raise ValueError(f"Rule: kind={self.kind!r}; expected one of {sorted(HYPERPARAMETERS)}")

    @property
    def hyperparameters(self) -> tuple[str, ...]:
        return HYPERPARAMETERS[self.kind]

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
            # lean states (group["state_dtype"] "bf16"/"int8"): the format follows the
            # tensors' dtypes; int8 codes come with their block scales
            lean = {f"{name}s": states[name] for name in lean_states.SCALE_NAMES if name in states}
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
                seed=int(group.get("seed", 0)),
                **lean,
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


RuleOf = Callable[[torch.optim.Optimizer], Rule]

# Looked up along the optimizer's MRO, so a subclass of a registered class has its
# parent's rule (torch.optim.AdamW before torch.optim.Adam: AdamW may subclass Adam).
_RULES: dict[type, RuleOf] = {}


def register_rule(cls: type, rule: Rule | RuleOf) -> None:
    """Teaches megalith an optimizer class: `rule` is its Rule, or a function of an
    instance giving one (for a class whose rule depends on its defaults)."""
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise TypeError(f"register_rule: {cls!r} is not a torch.optim.Optimizer subclass")
    _RULES[cls] = rule if callable(rule) else (lambda _optimizer, r=rule: r)


def rule_for(optimizer: torch.optim.Optimizer) -> Rule:
    """The rule of a torch or megalith Adam/AdamW, SGD or Lion (or a registered class);
    an error naming what is supported otherwise."""
    for cls in type(optimizer).__mro__:
        if cls in _RULES:
            return _RULES[cls](optimizer)
    raise ValueError(
        f"megalith: {type(optimizer).__name__} is not supported; ZeRO and megalith checkpoints "
        "step and save with the engine's fused Adam/AdamW, SGD or Lion. Pass "
        "torch.optim.Adam/AdamW/SGD or megalith.optim's HybridAdam/FusedAdam/CPUAdam, *SGD or "
        "*Lion (or teach megalith a class of your own with megalith_core.optim.register_rule)."
    )


register_rule(torch.optim.AdamW, Rule("adam", decoupled_default=True))
register_rule(torch.optim.Adam, Rule("adam"))
register_rule(torch.optim.SGD, Rule("sgd"))
register_rule(_EngineAdam, lambda opt: Rule("adam", bool(opt.defaults["decoupled_weight_decay"])))
register_rule(_EngineSGD, Rule("sgd"))
register_rule(_EngineLion, Rule("lion"))


def check_group(group: dict[str, Any], index: int) -> None:
    for key in ("capturable", "differentiable"):
        if group.get(key):
            raise ValueError(f"megalith: param group {index} sets {key}=True; not supported")
