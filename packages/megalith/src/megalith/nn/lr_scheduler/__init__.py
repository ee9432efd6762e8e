"""ColossalAI's colossalai.nn.lr_scheduler, by name, arguments and semantics: torch
LRScheduler subclasses with state_dict/load_state_dict, which also take the optimizer
booster.boost returns ([Note: schedulers on a boosted optimizer] in _base.py)."""

from .cosine import (
    CosineAnnealingLR,
    CosineAnnealingWarmupLR,
    FlatAnnealingLR,
    FlatAnnealingWarmupLR,
)
from .linear import LinearWarmupLR
from .multistep import MultiStepLR, MultiStepWarmupLR
from .onecycle import OneCycleLR
from .poly import PolynomialLR, PolynomialWarmupLR
from .torch import ExponentialLR, LambdaLR, MultiplicativeLR, StepLR

__all__ = [
    "CosineAnnealingLR",
    "CosineAnnealingWarmupLR",
    "ExponentialLR",
    "FlatAnnealingLR",
    "FlatAnnealingWarmupLR",
    "LambdaLR",
    "LinearWarmupLR",
    "MultiStepLR",
    "MultiStepWarmupLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "PolynomialLR",
    "PolynomialWarmupLR",
    "StepLR",
]
