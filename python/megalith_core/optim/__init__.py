"""Fused optimizers on megalith's engine, as torch.optim.Optimizer subclasses.

- Adam/AdamW: CPUAdam (host), FusedAdam (GPU), HybridAdam (both in one step)
- SGD: CPUSGD, FusedSGD, HybridSGD
- Lion: CPULion, FusedLion, HybridLion
- functional: the list-of-tensors steps they are built on (mixed precision,
  fused param copies, loss-scale unscaling and inf/nan checks).
"""

from . import functional
from .adam import CPUAdam, FusedAdam, HybridAdam
from .lion import CPULion, FusedLion, HybridLion
from .sgd import CPUSGD, FusedSGD, HybridSGD

__all__ = [
    "CPUSGD",
    "CPUAdam",
    "CPULion",
    "FusedAdam",
    "FusedLion",
    "FusedSGD",
    "HybridAdam",
    "HybridLion",
    "HybridSGD",
    "functional",
]
