"""Shared fixtures: SIMD levels to force, fresh random generators. Shared helpers that
tests import (the GPU mark, the README runner, CPU process groups) live in tests/support/."""

from __future__ import annotations

import os

# Bit-equality tests compare runs whose tensors sit at different addresses and on
# differently loaded cores: MKL's conditional numerical reproducibility (strict: results
# independent of alignment) with a fixed thread count keeps its GEMMs bit-identical
# between them. Read by MKL at its first call, so set before anything runs; spawned
# ranks inherit it.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
os.environ.setdefault("MKL_DYNAMIC", "FALSE")

import pytest
import torch

from megalith import _engine

# Spawned test ranks fork from a server that imported these once (megalith.testing).
# torch._dynamo: torch.optim's first optimizer imports it (about 1 s of CPU per rank, several
# seconds of wall time with 4 ranks on 2 cores); booster/test_plugins.py 149 s -> 55 s.
# transformers.modeling_utils: the first transformers model imports it (0.9 s per rank).
os.environ.setdefault(
    "MEGALITH_TEST_PRELOAD", "torch,torch._dynamo,megalith_comm,transformers.modeling_utils"
)

RUNNABLE_LEVELS = [lvl for lvl in _engine.simd_levels_compiled() if _engine.cpu_supports(lvl)]


@pytest.fixture(params=RUNNABLE_LEVELS)
def simd_level(request):
    """Runs the test once per SIMD level this build and CPU can run."""
    _engine.force_simd_level(request.param)
    yield request.param
    _engine.force_simd_level(None)


@pytest.fixture
def gen() -> torch.Generator:
    """A generator with a fresh seed per test, printed with a failure's output.

    MEGALITH_TEST_SEED=<seed> replays a failure.
    """
    seed = int(os.environ.get("MEGALITH_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
