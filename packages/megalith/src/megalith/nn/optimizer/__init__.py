"""ColossalAI's colossalai.nn.optimizer, by name and signature.

- HybridAdam, CPUAdam, FusedAdam, FusedSGD: megalith.optim's fused engine optimizers
  with ColossalAI's constructor arguments (ZeRO and offload take them).
- Lamb, FusedLAMB, Lars, Adafactor, CAME, GaLoreAdamW, GaLoreAdafactor: plain-torch
  torch.optim.Optimizer subclasses, each file opening with its paper and its rule.
  (They step their own parameters; megalith's ZeRO plugins, which step flat shards
  with an elementwise rule, refuse them by name.)
- DistributedLamb, DistributedAdaFactor, DistributedCAME: the local algorithm, with
  setup_distributed accepted for whole parameters and sharded cases refused.
- GaLoreAdamW8bit, DistGaloreAwamW: refused by name (bitsandbytes' 8-bit states).
- cast_to_distributed(optimizer): ColossalAI's conversion to the Distributed* class.
"""

from __future__ import annotations

import torch

from .adafactor import Adafactor
from .adam import CPUAdam, FusedAdam, HybridAdam
from .came import CAME
from .distributed import DistGaloreAwamW, DistributedAdaFactor, DistributedCAME, DistributedLamb
from .galore import GaLoreAdafactor, GaLoreAdamW, GaLoreAdamW8bit, get_galore_param_groups
from .lamb import FusedLAMB, Lamb
from .lars import Lars
from .sgd import FusedSGD

__all__ = [
    "CAME",
    "Adafactor",
    "CPUAdam",
    "DistGaloreAwamW",
    "DistributedAdaFactor",
    "DistributedCAME",
    "DistributedLamb",
    "FusedAdam",
    "FusedLAMB",
    "FusedSGD",
    "GaLoreAdafactor",
    "GaLoreAdamW",
    "GaLoreAdamW8bit",
    "HybridAdam",
    "Lamb",
    "Lars",
    "cast_to_distributed",
    "get_galore_param_groups",
]

optim2DistOptim: dict[type, type] = {
    GaLoreAdamW8bit: DistGaloreAwamW,
    Lamb: DistributedLamb,
    CAME: DistributedCAME,
    Adafactor: DistributedAdaFactor,
}


def cast_to_distributed(optim: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The Distributed* version of a Lamb, CAME or Adafactor (same param groups and
    hyperparameters, its states carried over); any other optimizer as it is."""
    target = optim2DistOptim.get(type(optim))
    if target is None:
        return optim
    new = target(optim.param_groups)
    for p, s in optim.state.items():
        new.state[p] = s
    return new
