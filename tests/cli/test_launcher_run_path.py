"""`megalith run --run_path` (torchrun's runpy.run_path of a script): its ranks start
through rank_entry.py like every other rank, so they die with the launcher and their
output lines reach the console whole under their [rankN]: prefix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megalith.launcher.rank_command import ENTRY, RUN_PATH_CODE, through_rank_entry
from tests.cli.test_launcher import megalith_run
from tests.cli.test_launcher_orphans import LOOPER, alive, rank_pids, wait_gone

pytestmark = pytest.mark.timeout(60)

SAYS = """
import os, sys, time
# what torchrun's run_script_path gives the script: __main__, argv[0] the script
print("rank %s %s %s %s" % (os.environ["RANK"], __name__, os.path.basename(sys.argv[0]),
                            " ".join(sys.argv[1:])))
print("parent %d" % os.getppid(), file=sys.stderr)
"""


def test_run_path_ranks_start_through_rank_entry():
    argv, split = through_rank_entry(["--nproc_per_node", "2", "--run_path", "s.py", "a"], 3)
    assert argv[:split] == ["--nproc_per_node", "2", "--no_python"]
    assert argv[split:][1:] == ["-S", ENTRY, str(os.getpid()), sys.executable, "-u", "-c",
                                RUN_PATH_CODE, "s.py", "a"]  # fmt: skip


@pytest.mark.timeout(75)
def test_run_path_output_is_prefixed_and_the_script_runs_as_main(tmp_path: Path):
    (tmp_path / "says.py").write_text(SAYS)
    result, _ = megalith_run(
        "--nproc_per_node", "2", "--run_path", str(tmp_path / "says.py"), "x", "--y", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "[rank0]:rank 0 __main__ says.py x --y",
        "[rank1]:rank 1 __main__ says.py x --y",
    ]
    parents = [line for line in result.stderr.splitlines() if "parent" in line]
    assert sorted(p.split(":")[0] for p in parents) == ["[rank0]", "[rank1]"], result.stderr


def test_run_path_ranks_die_with_the_launcher(tmp_path: Path):
    (tmp_path / "looper.py").write_text(LOOPER)
    out = tmp_path / "out"
    out.mkdir()
    run = [sys.executable, "-m", "megalith", "run", "--nproc_per_node", "2", "--run_path"]
    proc = subprocess.Popen(
        [*run, str(tmp_path / "looper.py"), str(out), "60"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        pids = rank_pids(out, 2)
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone, not its group
        killed = time.monotonic()
        proc.wait(10)
        left = wait_gone(pids, 5.0)
        took = time.monotonic() - killed
    finally:
        for pid in [p for p in rank_pids(out, 2, 1) if alive(p)]:
            os.kill(pid, signal.SIGKILL)  # never leave the test's own orphans behind
    assert not left, f"--run_path ranks {left} still alive {took:.1f} s after SIGKILL"
