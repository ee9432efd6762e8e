"""Fused optimizers on megalith's engine, as torch.optim.Optimizer subclasses.

- Adam/AdamW: CPUAdam (host), FusedAdam (GPU), HybridAdam (both in one step)
- SGD: CPUSGD, FusedSGD, HybridSGD
- Lion: CPULion, FusedLion, HybridLion
- functional: the list-of-tensors steps they are built on (mixed precision,
  fused param copies, loss-scale unscaling and inf/nan checks).
- rules: what megalith knows of an optimizer class (state names, hyperparameters,
  flat step): `rule_for(optimizer)`, `register_rule(cls, rule)`.
"""

from . import functional
from .adam import CPUAdam, FusedAdam, HybridAdam
from .lion import CPULion, FusedLion, HybridLion
from .rules import Rule, register_rule, rule_for
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
    "Rule",
    "functional",
    "register_rule",
    "rule_for",
]
