"""The model state of a dp-only ZeRO plan from megalith_zero.estimate itself (exact:
the engine's own chunk layout), for a model at hand (on the meta device is enough).

The plan's ZeroConfig is the one megalith would run it with: Strategy.zero_config of
the plugin of its stage, its precision and its offloaded share (megalith_offload's
OffloadConfig, static placement on host memory).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .knobs import Knobs

_STAGE_PLUGIN = {1: "zero1", 2: "zero2", 3: "gemini"}


def applies(knobs: Knobs) -> bool:
    """estimate models ZeRO over data parallelism alone."""
    return knobs.zero_stage >= 1 and knobs.tp == knobs.pp == knobs.sp == 1


def model_state(model: Any, knobs: Knobs) -> tuple[int, int, int, int, int, int]:
    """(params, grads, grads in flight, gathered, device optimizer, host) bytes per rank."""
    return _estimate(
        _Key(model), knobs.zero_stage, knobs.dp, knobs.offload_fraction, knobs.precision
    )


class _Key:
    """Hashes a model by identity, so the cache never hashes (or keeps alive) tensors' values."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __hash__(self) -> int:
        return id(self.model)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.model is self.model


@lru_cache(maxsize=256)
def _estimate(key: _Key, stage: int, dp: int, fraction: float, precision: str) -> tuple:
    import torch

    from megalith.strategy import Strategy
    from megalith_zero.estimate import estimate

    offload = None
    if fraction:
        from megalith_offload import OffloadConfig

        offload = OffloadConfig(tier="host", optim_frac=fraction)
    strategy = Strategy(plugin=_STAGE_PLUGIN[stage], precision=precision, offload=offload)
    model = key.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    e = estimate(model, optimizer, strategy.zero_config(), dp)
    d = e.device
    return (
        d["params"],
        d["grads"],
        d["grads_in_flight"],
        d["gathered"],
        d["masters_and_states"],
        e.host_bytes,
    )
