"""Failing fast with the rank named: a rank that never joins, raises, is killed, or hangs.

The raise/kill/hang cases run plain processes with torchrun's environment (this
file is also the rank script: `python test_comm_failures.py MODE FAIL_RANK`), so
what is checked is what a user sees: every surviving rank exits non-zero, soon,
and its error names the failed rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megalith.testing import DistributedTestError, free_port, run_distributed

WORLD = 3


def _noop(rank: int) -> int:
    return rank


@pytest.mark.timeout(60)
def test_rank_that_never_joins_fails_init_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(DistributedTestError) as info:
        run_distributed(
            _noop, WORLD, start_ranks=[0, 1], timeout=45, env={"MEGALITH_COMM_TIMEOUT": "3"}
        )
    elapsed = time.monotonic() - start
    text = str(info.value)
    assert "only 2 of 3 ranks arrived" in text and "missing rank: 2" in text, text
    assert "within 3 s" in text
    assert elapsed < 30, f"took {elapsed:.0f} s"


def _run_ranks(
    mode: str, fail_rank: int, timeout_s: float, port: int | None = None, **extra: str
) -> tuple[float, list[tuple]]:
    """Starts WORLD rank processes; returns (when fail_rank failed, [(rc, exit time, stderr)])."""
    env = {
        **os.environ,
        "WORLD_SIZE": str(WORLD),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port or free_port()),
        "MEGALITH_COMM_TIMEOUT": str(timeout_s),
        **extra,
    }
    procs = []
    for rank in range(WORLD):
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, mode, str(fail_rank)],
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    exits: dict[int, float] = {}
    deadline = time.monotonic() + 90
    try:
        while len(exits) < WORLD and time.monotonic() < deadline:
            for rank, p in enumerate(procs):
                if rank not in exits and p.poll() is not None:
                    exits[rank] = time.time()
            if mode == "hang" and len(exits) == WORLD - 1 and fail_rank not in exits:
                break  # the hung rank stays; the others are what we check
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out = []
    failed_at = None
    for rank, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=30)
        for line in stdout.splitlines():
            if line.startswith("FAILING_AT "):
                failed_at = float(line.split()[1])
        out.append((p.returncode, exits.get(rank), stderr))
    assert failed_at is not None or mode == "ok", "no rank failed:\n" + out[fail_rank][2]
    return failed_at, out


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "fail_rank", "named"),
    [
        ("raise", 1, "rank 1 failed with ValueError: deliberate failure on rank 1"),
        ("raise", 0, "rank 0 failed with ValueError: deliberate failure on rank 0"),
        ("kill", 2, "rank 2 stopped without reporting an error"),
        ("kill", 0, "rendezvous store on rank 0"),
    ],
)
def test_survivors_exit_nonzero_naming_the_rank(mode, fail_rank, named):
    # A long collective timeout: naming the rank must not wait for it.
    failed_at, ranks = _run_ranks(mode, fail_rank, timeout_s=60)
    for rank, (rc, exited, stderr) in enumerate(ranks):
        if rank == fail_rank:
            assert rc != 0
            continue
        assert rc not in (0, None), f"rank {rank} exited {rc}:\n{stderr}"
        assert exited - failed_at < 30, f"rank {rank} took {exited - failed_at:.0f} s"
        assert named in stderr, f"rank {rank} did not name rank {fail_rank}:\n{stderr[-3000:]}"
        assert "CommError" in stderr


@pytest.mark.timeout(120)
def test_hung_rank_is_named_after_the_timeout():
    failed_at, ranks = _run_ranks("hang", 1, timeout_s=4)
    for rank in (0, 2):
        rc, exited, stderr = ranks[rank]
        assert rc not in (0, None), stderr
        assert exited - failed_at < 30
        assert "rank 1 has issued 1 collective(s) on group 'world', this rank 2" in stderr, stderr


@pytest.mark.timeout(60)
def test_under_an_elastic_agent_the_agents_store_is_used():
    """torchrun / megalith run host the store themselves (TORCHELASTIC_USE_AGENT_STORE)."""
    import torch.distributed as dist

    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, None, True, wait_for_workers=False)
    _, ranks = _run_ranks(
        "ok",
        0,
        20,
        port=port,
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RUN_ID="job7",
        TORCHELASTIC_RESTART_COUNT="2",
    )
    assert [rc for rc, _, _ in ranks] == [0] * WORLD, ranks[0][2][-3000:]
    assert agent.add("job7/2/megalith_comm/arrived", 0) == WORLD


def _rank_main(mode: str, fail_rank: int) -> None:
    import torch

    import megalith_comm as comm

    world = comm.init()
    t = torch.ones(4)
    comm.all_reduce(t)  # everyone is up
    if mode == "ok":
        comm.barrier()
        comm.destroy()
        return
    if world.rank == fail_rank:
        print(f"FAILING_AT {time.time()}", flush=True)
        if mode == "raise":
            raise ValueError(f"deliberate failure on rank {world.rank}")
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "hang":
            time.sleep(600)
    for _ in range(100_000):
        comm.all_reduce(t)
    raise AssertionError("the collectives kept working without the failed rank")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    _rank_main(sys.argv[1], int(sys.argv[2]))
