"""stages.peak_activations: the activation bytes a rank holds at its worst moment, walked
from the schedule's own pass order (1F1B's in-flight count; ZB-V's bound; a split
backward holding a checkpointed micro-batch's recomputed activations from I to W)."""

from __future__ import annotations

import random

import pytest

from megalith.autoparallel import stages


@pytest.mark.parametrize("pp", [2, 4])
def test_1f1b_holds_pp_minus_rank_micro_batches(pp):
    kept = random.uniform(1.0, 9.0)
    for rank in range(pp):
        got = stages.peak_activations("1f1b", pp, 2 * pp, rank, (kept,) * pp, (kept,) * pp)
        assert got == pytest.approx((pp - rank) * kept)


@pytest.mark.parametrize("pp", [2, 4])
def test_zbv_stays_within_its_bound_and_checkpointing_costs_until_w(pp):
    """ZB-V starts a forward only while fewer than 2 pp chunk-activations wait for their
    I, and leaves at most 2 pp - 1 W pending (zero_bubble_v.py): at most 4 pp - 1 held
    from F to W; with checkpointing, I recomputes a stage's activations and the
    graph keeps them for W, so a checkpointed plan holds more than its boundaries."""
    stages_n = 2 * pp
    kept = tuple(random.uniform(1.0, 2.0) for _ in range(stages_n))
    whole = tuple(k * random.uniform(5.0, 10.0) for k in kept)
    for rank in range(pp):
        plain = stages.peak_activations("zbv", pp, 2 * pp, rank, whole, whole)
        assert max(whole) <= plain <= (4 * pp - 1) * max(whole) + 1e-9
        ckpt = stages.peak_activations("zbv", pp, 2 * pp, rank, kept, whole)
        assert ckpt >= min(whole[rank], whole[stages_n - 1 - rank]) + min(kept)
        assert ckpt <= plain + 1e-9
