"""FP8MixedPrecision: refused (megalith computes in fp32, fp16 or bf16)."""

from __future__ import annotations

from typing import Any

from .base import MixedPrecision


class FP8MixedPrecision(MixedPrecision):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "FP8MixedPrecision: megalith has no fp8 compute; use mixed_precision='bf16' "
            "(BF16MixedPrecision) or 'fp16' (FP16TorchMixedPrecision)"
        )
