"""`megalith train --plugin auto` with a plan of pp = 2 (fixed by --plan-fix): the loop
trains through booster.execute_pipeline on 4 CPU ranks, plan.json records the pipeline,
and the losses equal the plain single-process torch run of the same batches (fp32,
DESIGN.md's 1e-6 relative, with room for the stages' summation order)."""

from __future__ import annotations

import random

import pytest

from megalith.testing import run_distributed

from .train_pipeline_worker import pipelined_run, plain_losses

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("schedule", ["1f1b"])
def test_forced_pipeline_trains_and_matches_plain_torch(tmp_path, schedule):
    seed = random.randrange(1000)
    fix = f"pp=2,schedule={schedule}"
    got = run_distributed(pipelined_run, 4, (fix, str(tmp_path), seed), timeout=100)[0]
    plan = got["plan"]
    chosen = plan["chosen"]
    assert (chosen["pp"], chosen["schedule"], chosen["plugin"]) == (2, schedule, "hybrid"), chosen
    assert plan["fixed"] == {"pp": 2, "schedule": schedule}
    assert chosen["dp"] * chosen["tp"] * chosen["sp"] == 2
    assert chosen["dp"] * chosen["micro_batch"] * chosen["num_microbatches"] == 16
    reference = plain_losses(seed, chosen["dp"])
    assert [s for s, _ in got["losses"]] == [1, 2, 3, 4]
    for (step, loss), (_, want) in zip(got["losses"], reference):
        assert abs(loss - want) <= 1e-5 * abs(want), f"step {step}: {loss} vs {want} ({chosen})"
