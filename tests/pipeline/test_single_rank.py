"""One pp rank: every schedule's passes run in one process, stages handing messages over in
memory (interleaved puts several stages on the rank); the result is the whole model's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megalith_pipeline import SCHEDULES, StageModule, make_schedule, partition
from megalith_pipeline.channels import Channels
from megalith_pipeline.executor import Executor
from megalith_pipeline.tree import split_microbatches
from tests.pipeline import models
from tests.pipeline.checks import close


@pytest.mark.parametrize("name", SCHEDULES)
def test_one_rank_runs_every_stage(name):
    torch.manual_seed(0)
    ref, model = models.mixed(9), models.mixed(9)
    x, y = torch.randn(7, 4), torch.randn(7, 3)
    want = torch.nn.functional.mse_loss(ref(x), y)
    want.backward()

    schedule = make_schedule(name, 1, 3, chunks=3 if name == "interleaved" else None)
    layers = list(model)
    plan = partition(layers, schedule.num_stages)
    stages = {
        s: StageModule([layers[i] for i in plan.layers(s)], plan.bounds[s], s)
        for s in range(schedule.num_stages)
    }
    channels = Channels(schedule, SimpleNamespace(size=1, rank=0), torch.device("cpu"))
    executor = Executor(schedule, 0, stages, channels, torch.nn.functional.mse_loss)
    xs, sizes = split_microbatches(x, 3, "inputs")
    ys, _ = split_microbatches(y, 3, "targets")
    loss, _, stats = executor.run(xs, ys, [n / 7 for n in sizes])
    assert close(loss, want.detach()) <= 1e-5
    for p, q in zip(model.parameters(), ref.parameters()):
        assert close(p.grad, q.grad) <= 1e-5
    assert stats.recv_wait_s == 0.0 and len(stats.spans) == len(schedule.orders[0])
