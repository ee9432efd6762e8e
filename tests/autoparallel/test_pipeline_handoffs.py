"""A pipeline pass fed by another rank waits the profile's `pipeline_handoff_s` beyond
its message: the passes that take another rank's output, counted from megalith_pipeline's
schedule (against the stage layout of each schedule), charged in the cost model; and
calibrate's ring micro-benchmark of the wait."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from megalith import models
from megalith.autoparallel import analyze, predict
from megalith.autoparallel.calibrate_handoff import pipeline_handoff_s
from megalith.autoparallel.stages import handoffs_per_rank, passes_per_rank
from megalith.autoparallel.types import Cluster

from .handmade import cpu_like

pytestmark = pytest.mark.timeout(90)

CFG = dict(d_model=64, n_layers=4, n_heads=4, d_ff=256, vocab_size=256, max_seq_len=64)


@pytest.mark.parametrize("pp", [2, 4])
def test_the_count_is_the_passes_whose_input_another_rank_sends(pp):
    m = pp * random.randint(1, 6)
    inner = [2 * m] * (pp - 2)
    # 1F1B: a forward from the rank before (not on the first), a backward from the rank
    # after (not on the last)
    assert handoffs_per_rank("1f1b", pp, m) == (m, *inner, m)
    # ZB-V's V: rank 0 holds the first and the last stage, rank pp-1 the two middle ones
    # (hand-over in memory between them); W passes take nothing
    assert handoffs_per_rank("zbv", pp, m) == (2 * m, *[4 * m] * (pp - 2), 2 * m)
    # interleaved (2 chunks): every stage boundary crosses ranks but the pipeline's ends
    mid = [4 * m] * (pp - 2)
    assert handoffs_per_rank("interleaved", pp, m) == (3 * m, *mid, 3 * m)
    for name in ("1f1b", "interleaved", "zbv"):
        assert all(
            h <= p for h, p in zip(handoffs_per_rank(name, pp, m), passes_per_rank(name, pp, m))
        )


def test_the_model_charges_the_waits_inside_the_simulated_passes():
    a = analyze(models.create("gpt-tiny", device="meta", **CFG), 32, precision="fp32")
    prof = cpu_like()
    wait = random.uniform(1e-3, 1e-2)
    charged = Cluster(profile=replace(prof, pipeline_handoff_s=wait))
    free = Cluster(profile=replace(prof, pipeline_handoff_s=0.0))
    for schedule in ("1f1b", "interleaved", "zbv"):
        m = 8
        kw = dict(dp=2, pp=2, num_microbatches=m, precision="fp32", schedule=schedule)
        with_wait, without = predict(a, charged, **kw), predict(a, free, **kw)
        busiest = max(handoffs_per_rank(schedule, 2, m))
        assert with_wait.breakdown["pipeline_handoffs"] == pytest.approx(busiest * wait)
        assert "pipeline_handoffs" not in without.breakdown
        # the busiest rank waits every one of its hand-overs (the simulator's rounding of
        # stage-time ratios to 2 decimals aside); no rank waits more than all of them
        grown = with_wait.predicted_step_s - without.predicted_step_s
        total = sum(handoffs_per_rank(schedule, 2, m))
        assert 0.9 * busiest * wait <= grown <= 1.1 * total * wait, (schedule, grown)
    flat = predict(a, charged, dp=4, num_microbatches=m, precision="fp32")
    assert "pipeline_handoffs" not in flat.breakdown  # no pipeline, no hand-overs


def test_calibrate_times_the_ring_of_ranks():
    wait = pipeline_handoff_s(2, "gloo", message_s=1e-4, quick=True)
    # 2 ranks on the 2-core box: a wait of a few ms at most (more under other jobs' load)
    assert math.isfinite(wait) and 0.0 <= wait < 0.1, wait
    assert pipeline_handoff_s(1, "gloo", message_s=0.0) == 0.0
