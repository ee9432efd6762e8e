"""Failing clearly: a stage that raises makes every rank fail soon, naming the stage; counts
the pipeline cannot run are refused on every rank before any message is sent.

The failing-stage cases run plain processes with torchrun's environment (the script is
tests/pipeline/failing_stage.py), so what is checked is what a user sees: every rank
exits non-zero within seconds, and its error names the stage.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import megalith_comm as comm
from megalith.testing import free_port, run_grid
from megalith_pipeline import Pipeline
from tests.pipeline import models

SCRIPT = Path(__file__).resolve().parent / "failing_stage.py"
WORLD = 3


def _run_ranks(mode: str) -> list[tuple[int, float | None, str]]:
    """Starts the ranks; returns (exit code, seconds until it exited, stderr) per rank."""
    env = {
        **os.environ,
        "WORLD_SIZE": str(WORLD),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "MEGALITH_COMM_TIMEOUT": "60",  # naming the stage must not wait for it
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), mode],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(WORLD)
    ]
    start, exits = time.monotonic(), {}
    try:
        while len(exits) < WORLD and time.monotonic() - start < 90:
            for r, p in enumerate(procs):
                if r not in exits and p.poll() is not None:
                    exits[r] = time.monotonic() - start
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, exits.get(r), p.communicate(timeout=30)[1]) for r, p in enumerate(procs)]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("mode", "named"),
    [
        ("forward", "pipeline stage 1 (pp rank 1) failed in forward of micro-batch 1: ValueError"),
        (
            "backward",
            "pipeline stage 0 (pp rank 0) failed in backward of micro-batch 1: ValueError",
        ),
        ("loss", "pipeline stage 2 (pp rank 2) failed in the loss function of micro-batch 0"),
    ],
)
def test_a_failing_stage_fails_every_rank_naming_it(mode, named):
    ranks = _run_ranks(mode)
    for rank, (rc, exited, stderr) in enumerate(ranks):
        assert rc not in (0, None), f"rank {rank} exited {rc}:\n{stderr[-3000:]}"
        assert named in stderr, f"rank {rank} does not name the stage:\n{stderr[-3000:]}"
        # start-up (importing torch) included; the collective timeout is 60 s
        assert exited < 45, f"rank {rank} took {exited:.0f} s"
    print("exit times (s):", [round(e, 1) for _, e, _ in ranks])


def refused(rank: int, setting: dict):
    """Builds or steps a pipeline with counts it cannot run; returns the error text, then
    shows that no rank was left inside a collective (a barrier still completes)."""
    try:
        pipe = Pipeline(
            models.mlp(setting.get("layers", 8)),
            loss_fn=torch.nn.functional.mse_loss,
            **setting["kw"],
        )
        pipe.step(torch.randn(setting["batch"], 4), torch.randn(setting["batch"], 3))
        message = None
    except ValueError as exc:
        message = str(exc)
    comm.barrier()
    return message


@pytest.mark.timeout(120)
def test_counts_a_pipeline_cannot_run_fail_on_every_rank_before_sending():
    settings = [
        (
            {"kw": {"num_microbatches": 0}, "batch": 4},
            "num_microbatches=0; expected an integer >= 1",
        ),
        (
            {"kw": {"num_microbatches": 4}, "batch": 3},
            "batch size 3, fewer than num_microbatches=4",
        ),
        (
            {
                "kw": {"num_microbatches": 2, "schedule": "interleaved", "chunks": 3},
                "batch": 4,
                "layers": 5,
            },
            "5 layers cannot fill 6 stages",
        ),
        (
            {"kw": {"num_microbatches": 2, "schedule": "1f1b", "chunks": 2}, "batch": 4},
            "'1f1b' runs one stage per rank, got chunks=2",
        ),
        ({"kw": {"num_microbatches": 2, "balance": [5, 4]}, "batch": 4}, "must give 2 stages"),
    ]
    results = run_grid(refused, [s for s, _ in settings], 2, timeout=100)
    for (setting, text), per_rank in zip(settings, results):
        for message in per_rank:
            assert message is not None and text in message, (setting, message)
