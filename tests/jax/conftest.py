"""Fixtures of the JAX tests: a numpy generator seeded from the shared fresh seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture
def rng(gen: torch.Generator) -> np.random.Generator:
    return np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
