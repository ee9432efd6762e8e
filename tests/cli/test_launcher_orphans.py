"""Ranks die with their launcher: SIGKILL of `megalith run` (alone, or with its process
group) leaves no rank alive 5 s later, and a run started then runs alone; ranks that
lose the launcher's store (the backup for the parent-death signal) exit by themselves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megalith.testing import free_port

pytestmark = pytest.mark.timeout(60)

# Never imports megalith: the parent-death signal must hold for any script.
LOOPER = """
import os, sys, time
out, seconds = sys.argv[1], float(sys.argv[2])
with open(os.path.join(out, "pid%s.%d" % (os.environ["RANK"], os.getpid())), "w"):
    pass
end = time.time() + seconds
while time.time() < end:
    with open(os.path.join(out, "log"), "a") as f:
        f.write("%d %f\\n" % (os.getpid(), time.time()))
    time.sleep(0.1)
"""


def start_run(tmp_path: Path, out: Path, seconds: float) -> subprocess.Popen:
    run = [sys.executable, "-m", "megalith", "run", "--nproc_per_node", "2", "looper.py"]
    return subprocess.Popen(
        [*run, str(out), str(seconds)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def rank_pids(out: Path, count: int, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [int(p.suffix[1:]) for p in out.glob("pid*.*")]
        if len(pids) == count:
            return pids
        time.sleep(0.1)
    pytest.fail(f"the ranks did not start within {timeout} s: {sorted(out.iterdir())}")


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("target", ["launcher", "group"])
def test_sigkill_of_the_launcher_ends_its_ranks(tmp_path: Path, target: str):
    (tmp_path / "looper.py").write_text(LOOPER)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    proc = start_run(tmp_path, first, 60)
    try:
        pids = rank_pids(first, 2)
        if target == "launcher":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.time()
        proc.wait(10)
        left = wait_gone(pids, 5.0)
    finally:
        for pid in [p for p in rank_pids(first, 2, 1) if alive(p)]:
            os.kill(pid, signal.SIGKILL)  # never leave the test's own orphans behind
    assert not left, f"ranks {left} still alive 5 s after SIGKILL of the {target}"
    if target == "group":
        return
    # A second run (a resume, say) started now has the machine to itself.
    run = start_run(tmp_path, second, 1.0)
    assert run.wait(45) == 0, run.stderr.read().decode()
    new_pids = set(rank_pids(second, 2, 1))
    rows = [line.split() for line in (first / "log").read_text().splitlines()]
    late = [(pid, t) for pid, t in rows if int(pid) in pids and float(t) > killed_at + 0.5]
    assert not late, f"the first run's ranks wrote after the kill: {late[:3]}"
    assert new_pids.isdisjoint(pids) and (second / "log").stat().st_size > 0


STORE_HOST = """
import sys, time, datetime, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, True,
                      datetime.timedelta(seconds=20), wait_for_workers=False)
print("up", flush=True)
time.sleep(60)
"""
STORE_CLIENT = """
import sys, time
import megalith_comm as mc
mc.init(timeout=20)
print("ready", flush=True)
time.sleep(60)
"""


def test_ranks_exit_when_the_launchers_store_is_gone(tmp_path: Path):
    """As under the agent (TORCHELASTIC_USE_AGENT_STORE), with a stand-in agent that hosts the
    store and is then killed; the ranks are not its children (no parent-death signal)."""
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-c", STORE_HOST, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert agent.stdout.readline().strip() == "up"
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RUN_ID": "orphans",
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", STORE_CLIENT],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        for rank in ranks:
            assert rank.stdout.readline().strip() == "ready", rank.stderr.read()
        agent.kill()
        gone_at = time.monotonic()
        codes = [rank.wait(15) for rank in ranks]
        elapsed = time.monotonic() - gone_at
    finally:
        for proc in (*ranks, agent):
            if proc.poll() is None:
                proc.kill()
    assert codes == [1, 1]
    assert elapsed < 3.0, f"the ranks took {elapsed:.1f} s to notice"
    err = ranks[1].stderr.read()
    assert "lost the rendezvous store on the launcher's agent (127.0.0.1:" in err, err
    assert "the launcher exited or was killed" in err
