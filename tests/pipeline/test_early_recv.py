"""Early receives ([Note: early receives] in megalith_pipeline/channels.py): every message
from another rank is posted before the pass that needs it asks for it, and a pipeline whose
last micro-batch is smaller (a structure change on every channel, after receives of the
old structure were posted) still equals the whole model."""

from __future__ import annotations

import pytest
import torch

import megalith_comm as comm
from megalith.testing import run_distributed
from megalith_pipeline import Pipeline
from megalith_pipeline.channels import Channels
from tests.pipeline import models


def posts_before_asks(rank: int, schedule: str) -> dict:
    torch.set_num_threads(1)
    events: list[tuple[str, int, int]] = []
    real_recv, real_take = comm.recv, Channels._recv

    def recv(*args, **kwargs):
        events.append(("post", kwargs["tag"], len(events)))
        return real_recv(*args, **kwargs)

    def take(self, stage_from, tag, mb):
        if self._peer(stage_from) is not None:
            events.append(("ask", tag, mb))
        return real_take(self, stage_from, tag, mb)

    comm.recv, Channels._recv = recv, take
    try:
        pipe = Pipeline(
            models.mlp(8),
            num_microbatches=4,
            schedule=schedule,
            loss_fn=torch.nn.functional.mse_loss,
        )
        ref = models.mlp(8)
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(7, 4, generator=g), torch.randn(7, 3, generator=g)  # last mb: 1 row
        pipe.step(x, y)
        torch.nn.functional.mse_loss(ref(x), y).backward()
    finally:
        comm.recv, Channels._recv = real_recv, real_take
    posts: dict[int, int] = {}
    asks: dict[int, int] = {}
    late = []  # messages asked for before their receive was posted
    for kind, tag, mb in events:
        counter = posts if kind == "post" else asks
        counter[tag] = counter.get(tag, 0) + 1
        if kind == "ask" and posts.get(tag, 0) < asks[tag]:
            late.append((tag, mb))
    grads_equal = all(
        torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7)
        for p, q in zip(pipe.module.parameters(), _held(pipe, ref))
    )
    return {"posts": posts, "asks": asks, "late": late, "grads_equal": grads_equal}


def _held(pipe: Pipeline, ref: torch.nn.Module) -> list[torch.nn.Parameter]:
    layers = list(ref)
    return [q for stage in pipe.module for i in stage.layer_ids for q in layers[i].parameters()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_every_receive_is_posted_before_it_is_needed(schedule):
    ranks = run_distributed(posts_before_asks, 2, schedule, timeout=100)
    for r in ranks:
        assert r["grads_equal"], r
        # every message was posted once, before the pass that needed it asked for it
        assert r["posts"] == r["asks"] and r["asks"] and not r["late"], r
