"""megalith.testing.run_distributed / run_grid: results, failures, hangs and GPU skips."""

from __future__ import annotations

import os
import time

import pytest
import torch

import megalith_comm as comm
from megalith.testing import DistributedTestError, run_distributed, run_grid


def _results(rank: int, scale: int) -> dict:
    world = comm.get_world()
    return {
        "rank": rank,
        "ws": world.world_size,
        "env": os.environ["WORLD_SIZE"],
        "x": rank * scale,
    }


def _misbehave(rank: int, how: str) -> None:
    t = torch.ones(1)
    comm.all_reduce(t)
    if rank == 1:
        if how == "raise":
            raise KeyError("rank one is broken")
        if how == "exit":
            os._exit(3)
        if how == "hang":
            time.sleep(300)
    comm.all_reduce(t)  # the others wait for rank 1


def _setting(rank: int, setting: int) -> int:
    if setting == 2 and rank == 0:
        raise ValueError("bad setting")
    return rank + setting


@pytest.mark.timeout(60)
def test_results_in_rank_order_and_grid():
    assert run_distributed(_results, 2, 10, timeout=50) == [
        {"rank": 0, "ws": 2, "env": "2", "x": 0},
        {"rank": 1, "ws": 2, "env": "2", "x": 10},
    ]


@pytest.mark.timeout(60)
def test_grid_names_the_failing_setting():
    assert run_grid(_setting, [0, 1], 2, timeout=50) == [[0, 1], [1, 2]]
    with pytest.raises(DistributedTestError) as info:
        run_grid(_setting, [0, 1, 2], 2, timeout=50)
    assert "setting 2 (2): ValueError: bad setting" in str(info.value)
    assert info.value.rank == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("raise", "rank 1 raised KeyError: 'rank one is broken'"),
        ("exit", "rank 1 exited with code 3 without returning"),
        ("hang", "timed out after 8 s; rank(s) [0, 1] had not finished"),
    ],
)
def test_failures_fail_fast_with_the_rank(how, message):
    start = time.monotonic()
    env = {"MEGALITH_COMM_TIMEOUT": "60"}  # the helper, not the collective timeout, must act
    # Only the hang waits for the helper's timeout; the others must end as soon as they fail
    # (a short timeout there would only make a loaded machine fail the test).
    with pytest.raises(DistributedTestError) as info:
        run_distributed(_misbehave, 2, how, timeout=8 if how == "hang" else 40, env=env)
    assert message in str(info.value), str(info.value)
    if how == "raise":
        assert "Traceback" in str(info.value) and "_misbehave" in str(info.value)
    assert time.monotonic() - start < 25


def test_gpu_backend_skips_without_gpus():
    if torch.cuda.device_count() >= 64:
        pytest.skip("has 64 GPUs")
    with pytest.raises(pytest.skip.Exception, match="needs 64 CUDA GPUs"):
        run_distributed(_results, 64, 1, backend="nccl")
