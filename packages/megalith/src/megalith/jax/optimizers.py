"""adamw, lion and sgd with optax's signatures (optax 0.2.x), on the engine's fused kernels.

Each returns an ``optax.GradientTransformationExtraArgs`` whose ``update(grads, state,
params)`` gives optax's updates (apply them with ``optax.apply_updates``). What the engine
does not have is refused with the optax call to use instead, never silently ignored.
bf16/fp16 parameters get an fp32 master in the state and fp32 updates (optax keeps the
moments in the parameters' dtype instead): the result equals optax run on fp32
parameters, rounded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optax

from megalith_core.optim import functional as F

from .transform import EngineTransform, Group


def _float(x: Any) -> float:
    return float(np.asarray(x))


def _moments_fp32(mu_dtype: Any, name: str, arg: str) -> None:
    if mu_dtype is not None and np.dtype(mu_dtype) != np.float32:
        raise ValueError(
            f"megalith.jax.{name}: {arg}={np.dtype(mu_dtype).name}: the engine keeps moments in "
            f"float32; leave {arg}=None (or use optax.{name} for low-precision moments)"
        )


def adam_rule(b1: Any, b2: Any, eps: Any):
    """The engine's fused AdamW step on one group (in memory or offloaded alike)."""
    betas, eps_f = (_float(b1), _float(b2)), _float(eps)

    def rule(g: Group, step: int, lr: float, wd: float) -> None:
        F.adam_step(
            g.masters,
            g.grads,
            g.moments["mu"],
            g.moments["nu"],
            param_copies=g.copies,
            step=step,
            lr=lr,
            betas=betas,
            eps=eps_f,
            weight_decay=wd,
        )

    return rule


def adamw(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any | None = None,
    weight_decay: optax.ScalarOrSchedule = 1e-4,
    mask: Any | None = None,
    *,
    nesterov: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """optax.adamw on the engine's fused AdamW (decoupled decay, bias correction)."""
    if _float(eps_root) != 0.0:
        raise ValueError(
            "megalith.jax.adamw: eps_root is not in the engine's fused Adam; use eps_root=0.0 "
            "or optax.adamw"
        )
    if nesterov:
        raise ValueError(
            "megalith.jax.adamw: nesterov=True (NAdamW) is not fused; use optax.nadamw"
        )
    _moments_fp32(mu_dtype, "adamw", "mu_dtype")
    rule = adam_rule(b1, b2, eps)

    return EngineTransform(
        "adamw", ("mu", "nu"), rule, learning_rate, weight_decay, mask
    ).transformation()


def lion(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.99,
    mu_dtype: Any | None = None,
    weight_decay: optax.ScalarOrSchedule = 1e-3,
    mask: Any | None = None,
) -> optax.GradientTransformationExtraArgs:
    """optax.lion on the engine's fused Lion."""
    _moments_fp32(mu_dtype, "lion", "mu_dtype")
    betas = (_float(b1), _float(b2))

    def rule(g: Group, step: int, lr: float, wd: float) -> None:
        F.lion_step(
            g.masters,
            g.grads,
            g.moments["mu"],
            param_copies=g.copies,
            step=step,
            lr=lr,
            betas=betas,
            weight_decay=wd,
        )

    return EngineTransform(
        "lion", ("mu",), rule, learning_rate, weight_decay, mask
    ).transformation()


def sgd(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float | None = None,
    nesterov: bool = False,
    accumulator_dtype: Any | None = None,
) -> optax.GradientTransformationExtraArgs:
    """optax.sgd on the engine's fused SGD (optax's trace is torch's momentum buffer)."""
    _moments_fp32(accumulator_dtype, "sgd", "accumulator_dtype")
    mom = 0.0 if momentum is None else _float(momentum)
    if nesterov and mom == 0.0:
        raise ValueError("megalith.jax.sgd: nesterov=True needs a momentum > 0")
    moments = ("trace",) if mom != 0.0 else ()

    def rule(g: Group, step: int, lr: float, wd: float) -> None:
        F.sgd_step(
            g.masters,
            g.grads,
            g.moments["trace"] if mom != 0.0 else None,
            param_copies=g.copies,
            first_step=step == 1,
            lr=lr,
            momentum=mom,
            nesterov=nesterov,
        )

    return EngineTransform("sgd", moments, rule, learning_rate).transformation()
