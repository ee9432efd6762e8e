"""Every ZeRO stage against single-process torch AdamW on the same model and data.

One process group per world size runs all cases (run_grid). The toy model (tests/zero/toy.py)
has odd sizes, a tied head, a Linear called twice and one never called; chunks are small,
so shards cut through parameters. fp32 must match torch within 1e-5 relative at each of 8
steps (AdamW's moments and bias correction act from step 2 on; more steps add time, not checks),
and stages 1, 2 and 3 must agree with each other to the last few bits.
"""

from __future__ import annotations

import pytest
import torch

from megalith.testing import run_grid
from tests.zero import toy
from tests.zero.worker import Case, train

STEPS = 8
FP32_CASES = [
    Case(stage=1, steps=STEPS),
    Case(stage=2, steps=STEPS),
    Case(stage=3, steps=STEPS),
    Case(stage=1, accumulate=2, max_norm=0.5, steps=STEPS),
    Case(stage=2, accumulate=2, max_norm=0.5, steps=STEPS),
    Case(stage=3, accumulate=2, max_norm=0.5, steps=STEPS),
    Case(stage=2, accumulate=3, no_sync=True, max_norm=0.5, steps=STEPS),
    Case(stage=3, accumulate=2, no_sync=True, steps=STEPS),
    Case(stage=1, accumulate=2, no_sync=True, steps=STEPS),
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_fp32_matches_torch(world_size):
    results = run_grid(train, FP32_CASES, world_size, timeout=240)
    by_stage = {}
    for case, per_rank in zip(FP32_CASES, results):
        losses, params = per_rank[0]
        ref_losses, ref_params = toy.reference(
            case.seed, case.steps, case.accumulate, case.max_norm
        )
        assert params.keys() >= ref_params.keys()
        for name, ref in ref_params.items():
            err = rel(params[name], ref)
            assert err < 1e-5, f"{case} world {world_size}: {name} differs from torch by {err:.3g}"
        unused = params["unused.weight"]
        assert torch.equal(unused, ref_params["unused.weight"]), "an unused parameter moved"
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) < 1e-5 * max(
            map(abs, ref_losses)
        )
        key = (case.accumulate, case.no_sync, case.max_norm)
        by_stage.setdefault(key, []).append(params)
    for key, runs in by_stage.items():
        for other in runs[1:]:
            for name in runs[0]:
                assert rel(other[name], runs[0][name]) < 1e-6, f"stages disagree on {name} ({key})"
