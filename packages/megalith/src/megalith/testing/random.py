"""seed_all (colossalai.testing.random): one seed for python, numpy, torch and CUDA."""

from __future__ import annotations

import random as _random

import numpy as np
import torch

__all__ = ["seed_all"]


def seed_all(seed: int, cuda_deterministic: bool = False) -> None:
    """Seeds every generator a test draws from. cuda_deterministic picks cuDNN's
    deterministic kernels (slower); otherwise cuDNN may benchmark and choose."""
    _random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    torch.backends.cudnn.deterministic = cuda_deterministic
    torch.backends.cudnn.benchmark = not cuda_deterministic
