"""The GPU mark: a test that needs a CUDA GPU and a CUDA build of the engine skips without."""

from __future__ import annotations

import pytest
import torch

from megalith_core import _engine


def has_cuda_engine() -> bool:
    return torch.cuda.is_available() and _engine.cuda_compiled() and _engine.cuda_device_count() > 0


gpu = pytest.mark.skipif(
    not has_cuda_engine(), reason="needs a CUDA GPU and megalith built with CUDA"
)
