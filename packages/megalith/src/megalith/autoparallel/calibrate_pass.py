"""What one pipeline pass costs beside its compute, timed here: the profile's
`pipeline_pass_s`, seconds per pass (a forward, backward, I or W of one micro-batch on
one stage).

megalith_pipeline's executor runs every pass of a rank's order the same way whatever
its size: it looks up the stage and the micro-batch's saved state, takes the input
from the channel (a message, or a hand-over between stages on the rank), runs the
stage under the pass's own autograd call, and stores or sends what it made. For a
micro-batch of one sequence that fixed work is a real share of the pass, and the
compute term (rate x work) does not see it.

The micro-benchmark: the real Executor over one rank's schedule of STAGES stages
(interleaved, so every stage is on the rank and messages are handed over in memory),
each stage one tiny Linear (a kernel of a few microseconds, so the time is the passes'
own), MICROBATCHES micro-batches of ROWS rows; a step's time over its number of passes.
The median of a few repetitions.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch
from torch import nn

#: the micro-benchmark's stages, micro-batches and their size (rows x WIDTH)
STAGES, MICROBATCHES, ROWS, WIDTH = 4, 8, 1, 16


def pipeline_pass_s(device: torch.device, reps: int = 9) -> float:
    """Seconds one pipeline pass costs beside its compute (>= 0)."""
    from megalith_pipeline import StageModule, make_schedule
    from megalith_pipeline.channels import Channels
    from megalith_pipeline.executor import Executor

    schedule = make_schedule("interleaved", 1, MICROBATCHES, chunks=STAGES)
    layers = [nn.Linear(WIDTH, WIDTH).to(device) for _ in range(STAGES)]
    stages = {s: StageModule([layers[s]], s, s) for s in range(STAGES)}
    channels = Channels(schedule, SimpleNamespace(size=1, rank=0), device)
    executor = Executor(schedule, 0, stages, channels, nn.functional.mse_loss)
    passes = len(schedule.orders[0])

    def step() -> float:
        xs = [torch.randn(ROWS, WIDTH, device=device) for _ in range(MICROBATCHES)]
        ys = [torch.randn(ROWS, WIDTH, device=device) for _ in range(MICROBATCHES)]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        executor.run(xs, ys, [1.0 / MICROBATCHES] * MICROBATCHES)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    for _ in range(2):  # warm-up
        step()
    return max(0.0, statistics.median(step() for _ in range(reps)) / passes)
