"""BF16MixedPrecision: bf16 autocast; bf16 has fp32's range, so there is no loss scale."""

from __future__ import annotations

from .base import MixedPrecision


class BF16MixedPrecision(MixedPrecision):
    precision = "bf16"
    loss_scale = None
