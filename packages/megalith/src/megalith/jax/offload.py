"""offloaded_adamw: AdamW whose fp32 master and moments live in the engine's host memory.

The state is allocated from the engine's pinned host resource when a GPU is there (page-
locked, so device copies run at full speed), from its pageable host resource otherwise,
under an optional byte limit the engine enforces. Each step only the gradients come down
(every device-to-host copy is started before the first chunk is stepped, so later chunks
arrive while earlier ones are stepped on the host SIMD kernel) and only the updates go
up, in the parameters' dtype (bf16 for a bf16 model). The parameters are never read
back: their fp32 master is the truth, so apply every update this returns.
"""

from __future__ import annotations

from typing import Any

import optax

from megalith_core import _engine
from megalith_core.memory import host_resource

from .optimizers import _float, _moments_fp32, adam_rule
from .transform import EngineTransform


def offloaded_adamw(
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
    pinned: bool | None = None,
    limit_bytes: int | None = None,
    chunk_bytes: int = 64 << 20,
) -> optax.GradientTransformationExtraArgs:
    """optax.adamw's arguments, plus: pinned (None: when a GPU is there), limit_bytes (the
    most host bytes the state and one step's buffers may take; MemoryError past it) and
    chunk_bytes (state bytes stepped per chunk)."""

    if _float(eps_root) != 0.0 or nesterov:
        raise ValueError(
            "megalith.jax.offloaded_adamw: eps_root and nesterov are not in the engine's fused "
            "Adam; leave eps_root=0.0 and nesterov=False"
        )
    _moments_fp32(mu_dtype, "offloaded_adamw", "mu_dtype")

    def resource() -> _engine.memory.Resource:
        upstream = host_resource(pinned)
        if limit_bytes is not None:
            upstream = _engine.memory.LimitingAdaptor(upstream, limit_bytes)
        return _engine.memory.StatisticsAdaptor(upstream)

    rule = adam_rule(b1, b2, eps)

    return EngineTransform(
        "offloaded_adamw",
        ("mu", "nu"),
        rule,
        learning_rate,
        weight_decay,
        mask,
        resource=resource,
        read_params=False,
        chunk_bytes=chunk_bytes,
    ).transformation()
