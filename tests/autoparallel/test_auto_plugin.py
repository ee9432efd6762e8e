"""AutoPlugin (`Booster(plugin="auto")`) on CPU ranks: whatever the planner chooses, the
losses equal the plain single-process run on the same data (fp32: 1e-5 relative, as the
other plugins' tests); a device budget just under the free choice's predicted peak makes
it choose something smaller that still matches; every rank runs the same plan, and ranks
given different models fail at the plan instead of hanging."""

from __future__ import annotations

import random

import pytest

from megalith.testing import run_distributed, run_grid

from .auto_workers import BATCH, SEQ, Setting, auto_train, odd_model_on_rank_1, plain_losses

pytestmark = pytest.mark.timeout(240)

KEYS = (
    "dp", "tp", "pp", "sp", "zero_stage", "offload", "micro_batch", "num_microbatches", "ckpt",
    "schedule", "predicted_step_s", "predicted_tokens_per_s", "predicted_peak_bytes",
)  # fmt: skip


def close(a: list[float], b: list[float], rel: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize("world_size", [2, 4])
def test_auto_matches_plain_torch_whatever_it_chose(world_size):
    seed = random.randrange(1000)
    reference = plain_losses(seed)
    assert reference[-1] < reference[0], f"the model did not learn: {reference}"
    settings = [Setting(seed), Setting(seed, budget="tight")]
    roomy, tight = run_grid(auto_train, settings, world_size, timeout=200)
    for runs in (roomy, tight):
        plans = [r["plan"] for r in runs]
        assert all(p == plans[0] for p in plans), "ranks ran different plans"
        chosen = plans[0]["chosen"]
        assert set(KEYS) <= set(chosen) and all(set(KEYS) <= set(c) for c in plans[0]["candidates"])
        assert chosen["dp"] * chosen["tp"] * chosen["pp"] * chosen["sp"] == world_size
        assert chosen["dp"] * chosen["micro_batch"] * chosen["num_microbatches"] == BATCH
        assert plans[0]["global_batch_tokens"] == BATCH * SEQ
        losses = runs[0]["losses"]
        assert close(losses, reference, 1e-5), f"{chosen['plugin']}: {losses} vs {reference}"
    free, forced = roomy[0]["plan"]["chosen"], tight[0]["plan"]["chosen"]
    budget = tight[0]["budget"] * 1e9
    assert forced["predicted_peak_bytes"] <= budget < free["predicted_peak_bytes"]
    differs = ("plugin", "tp", "zero_stage", "offload", "offload_fraction", "ckpt", "micro_batch")
    assert any(forced[k] != free[k] for k in differs), (free, forced)


def test_ranks_with_different_models_fail_at_the_plan():
    seed = random.randrange(1000)
    messages = run_distributed(odd_model_on_rank_1, 2, seed, timeout=60)
    assert all("rank(s) [1]" in m and "another model" in m for m in messages), messages
