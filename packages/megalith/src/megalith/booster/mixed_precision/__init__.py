"""megalith.booster.mixed_precision: ColossalAI's mixed-precision objects for the Booster.

    Booster(mixed_precision=FP16TorchMixedPrecision(init_scale=2**12))
    Booster(mixed_precision="bf16")      # mixed_precision_factory("bf16")

Each carries `precision` ("fp16", "bf16", "fp32") and `loss_scale` (a LossScaleConfig
for fp16, else None); configure(model, optimizer, criterion) wraps them on its own.
"""

from .base import MixedPrecision
from .bf16 import BF16MixedPrecision
from .fp8 import FP8MixedPrecision
from .fp16_apex import FP16ApexMixedPrecision
from .fp16_naive import FP16NaiveMixedPrecision
from .fp16_torch import FP16TorchMixedPrecision, TorchAMPModule, TorchAMPOptimizer

__all__ = [
    "BF16MixedPrecision",
    "FP8MixedPrecision",
    "FP16ApexMixedPrecision",
    "FP16NaiveMixedPrecision",
    "FP16TorchMixedPrecision",
    "MixedPrecision",
    "TorchAMPModule",
    "TorchAMPOptimizer",
    "mixed_precision_factory",
]

_MAPPING = {
    "fp16": FP16TorchMixedPrecision,
    "fp16_apex": FP16ApexMixedPrecision,
    "fp16_naive": FP16NaiveMixedPrecision,
    "bf16": BF16MixedPrecision,
    "fp8": FP8MixedPrecision,
}


def mixed_precision_factory(mixed_precision_type: str) -> MixedPrecision:
    """The MixedPrecision named "fp16", "fp16_apex", "fp16_naive" or "bf16", with its
    defaults ("fp8" is refused: megalith has no fp8 compute)."""
    if mixed_precision_type not in _MAPPING:
        raise ValueError(
            f"mixed precision {mixed_precision_type!r} is not supported; expected one of "
            f"{', '.join(_MAPPING)}"
        )
    return _MAPPING[mixed_precision_type]()
