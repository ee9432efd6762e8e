"""A rank stopped by SIGSTOP: the survivor's CommError names it after the collective
timeout, the launcher kills the stopped rank at once (not after the agent's 30 s), and
its last line says which rank hung, in which op and group, and for how long."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.cli.test_launcher import megalith_run

TIMEOUT_S = 3

HUNG = """
import os, signal, sys, time, torch, megalith_comm as mc
world = mc.init()
x = torch.randn(8)
mc.all_reduce(x)
if world.rank == 1:
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGSTOP)
mc.all_reduce(x)
"""


@pytest.mark.timeout(60)
def test_stopped_rank_is_named_with_op_group_and_wait(tmp_path: Path):
    (tmp_path / "hung.py").write_text(HUNG)
    env = {"MEGALITH_COMM_TIMEOUT": str(TIMEOUT_S)}
    result, _ = megalith_run("--nproc_per_node", "2", "hung.py", "stopped_at", cwd=tmp_path,
                             env=env)  # fmt: skip
    ended = time.time()
    stopped = float((tmp_path / "stopped_at").read_text())
    assert result.returncode == 137, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("megalith run: rank 1 (local_rank 1, pid "), result.stderr
    assert "hung and failed first" in last and "the launcher killed it" in last, last
    assert f"rank 0 waited {TIMEOUT_S} s for it in all_reduce" in last, last
    assert "on group 'world'" in last and "is stopped (SIGSTOP or a debugger)" in last, last
    assert "killed by signal SIGKILL" not in result.stderr
    assert ended - stopped < TIMEOUT_S + 5, f"the job took {ended - stopped:.1f} s after the stop"
