"""The idle time measured on CPU ranks agrees with the simulator's bubble fraction.

Layers sleep fixed times in forward, input-gradient and weight-gradient passes
(tests/pipeline/models.py: Sleepy), so the pass times do not depend on how busy the
two CPU cores are. Each rank records when it computed; the bubble measured over the
ranks (1 - busy / (pp x makespan)) is compared with simulate() given the measured
mean time of each pass kind on each stage and the measured message latency
(communication counts as idle in both). What the simulator leaves out, the
bookkeeping between passes (about a millisecond each here), keeps the measured
bubble a few hundredths above the simulated one: the tolerance is 0.06.
"""

from __future__ import annotations

import pytest
import torch

import megalith_comm as comm
from megalith.testing import run_grid
from megalith_pipeline import (
    SCHEDULES,
    Pipeline,
    make_schedule,
    mean_pass_times,
    measured_bubble,
    simulate,
)
from tests.pipeline import models

PASS_S = 0.025
M = {2: 4, 4: 8}  # micro-batches per world size


def timed_step(rank: int, schedule: str):
    pp = comm.get_world().world_size
    chunks = 2 if schedule in ("interleaved", "zb-v") else 1
    model = models.sleepy(pp * chunks, PASS_S, PASS_S, PASS_S)
    pipe = Pipeline(
        model,
        num_microbatches=M[pp],
        schedule=schedule,
        loss_fn=lambda out, y: (out - y).pow(2).mean(),
    )
    x, y = torch.randn(M[pp], 4), torch.randn(M[pp], 4)
    pipe.step(x, y)  # warm-up: negotiates the channels' shapes
    comm.barrier()
    pipe.step(x, y)
    return pipe.last_stats


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pp", [2, 4])
def test_measured_idle_time_matches_the_simulator(pp):
    results = run_grid(timed_step, list(SCHEDULES), pp, timeout=100)
    measured = {}
    for name, stats in zip(SCHEDULES, results):
        schedule = make_schedule(name, pp, M[pp])
        predicted = simulate(schedule, mean_pass_times(stats, schedule.num_stages))
        measured[name] = measured_bubble(stats)
        assert abs(measured[name] - predicted.bubble_fraction) < 0.06, (
            f"{name}: measured bubble {measured[name]:.3f}, simulated "
            f"{predicted.bubble_fraction:.3f}\n{predicted.render()}"
        )
        for s in stats:  # each rank's own idle share is what the makespan leaves
            assert 0.0 <= s.idle_fraction < 1.0
    assert measured["zb-h1"] < measured["1f1b"] and measured["interleaved"] < measured["1f1b"]
