"""torch dtypes <-> engine dtypes."""

from __future__ import annotations

import torch

from megalith_core import _engine

ENGINE_DTYPE = {
    torch.float32: _engine.DType.f32,
    torch.bfloat16: _engine.DType.bf16,
    torch.float16: _engine.DType.f16,
}
GRAD_DTYPES = tuple(ENGINE_DTYPE)
NONFINITE = {
    "ignore": _engine.NonFinite.ignore,
    "detect": _engine.NonFinite.detect,
    "skip": _engine.NonFinite.skip,
}


def engine_dtype(dtype: torch.dtype, what: str) -> _engine.DType:
    try:
        return ENGINE_DTYPE[dtype]
    except KeyError:
        raise TypeError(f"{what}: expected float32, bfloat16 or float16, got {dtype}") from None


def nonfinite_mode(mode: str) -> _engine.NonFinite:
    try:
        return NONFINITE[mode]
    except KeyError:
        raise ValueError(f"nonfinite: expected one of {sorted(NONFINITE)}, got {mode!r}") from None
