"""`megalith run`: end to end on CPU ranks (Gloo), the failure summary, hostfiles
and per-host commands, and the errors for bad arguments.

Multi-host runs replace ssh with a local shell (MEGALITH_SSH), both "hosts"
being this machine (localhost and 127.0.0.1).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megalith.cli.main import build_parser, main
from megalith.cli.run import plan_launch
from megalith.launcher.hostfile import LaunchError, filter_hosts, parse_hostfile_text, plan_nodes
from megalith.launcher.report import Failure, first_failure, summary
from megalith.launcher.ssh import STARTED

# Every test has a hard limit; the end-to-end ones a larger one (45 s run + teardown).
pytestmark = pytest.mark.timeout(60)

WORKER = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
for part in ("rank %d" % dist.get_rank(), " ok", " %g" % total.item(), "\\n"):
    sys.stdout.write(part)  # a line in pieces, as print writes under python -u
    time.sleep(0.15)
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w") as f:
    f.write(" ".join(os.environ[k] for k in keys) + " %g" % total.item())
dist.destroy_process_group()
"""
FAILING = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == int(sys.argv[1]):
    print("ValueError: shard 7 of the dataset is empty", file=sys.stderr, flush=True)
    sys.exit(3)
dist.all_reduce(torch.ones(1))  # the others block here until the launcher stops them
"""
FAKE_SSH = """#!/bin/sh
# stands in for ssh: [-p PORT] HOST COMMAND runs COMMAND here
if [ "$1" = "-p" ]; then shift 2; fi
echo "$1" >> "$0.hosts"
exec /bin/sh -c "$2"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def megalith_run(*args: str, cwd: Path, env: dict | None = None, timeout: float = 45):
    """Runs `megalith run` in its own process group; on a hang, SIGTERM to the group (the
    agents tear their ranks down), then SIGKILL, and the test fails with the output."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "megalith", "run", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"megalith run {' '.join(args)} hung for {timeout} s:\n{out}\n{err}")
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return result, time.monotonic() - start


def read_ranks(out: Path) -> dict[int, list[str]]:
    return {int(p.name[4:]): p.read_text().split() for p in out.glob("rank*")}


@pytest.fixture
def job(tmp_path: Path) -> Path:
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "failing.py").write_text(FAILING)
    (tmp_path / "out").mkdir()
    ssh = tmp_path / "fake_ssh.sh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    (tmp_path / "hosts").write_text(
        "# two nodes on this machine\nlocalhost slots=1\n\n127.0.0.1 slots=1\n"
    )
    return tmp_path


# -- end to end ------------------------------------------------------------------


@pytest.mark.timeout(75)
def test_two_ranks_on_one_node(job: Path):
    result, _ = megalith_run("--nproc_per_node", "2", "worker.py", "out", cwd=job)
    assert result.returncode == 0, result.stderr
    # Each rank's line whole, under its prefix, however its pieces interleaved.
    assert sorted(result.stdout.splitlines()) == ["[rank0]:rank 0 ok 3", "[rank1]:rank 1 ok 3"]
    ranks = read_ranks(job / "out")
    assert sorted(ranks) == [0, 1]
    for rank, (env_rank, world, local, addr, total) in ranks.items():
        assert (int(env_rank), world, int(local), total) == (rank, "2", rank, "3")
        assert addr


@pytest.mark.timeout(75)
def test_failing_rank_is_named_last(job: Path):
    result, elapsed = megalith_run("--nproc-per-node=2", "failing.py", "1", cwd=job)
    assert result.returncode == 3, result.stderr
    assert elapsed < 30
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("megalith run: rank 1 (local_rank 1, pid "), result.stderr
    assert "failed first, exit code 3: ValueError: shard 7 of the dataset is empty" in last
    assert "then rank 0" in result.stderr


@pytest.mark.timeout(75)
def test_two_hosts_through_replaced_ssh(job: Path):
    port = str(free_port())
    env = {"MEGALITH_SSH": str(job / "fake_ssh.sh"), "NCCL_DEBUG": "WARN"}
    args = ("--hostfile", "hosts", "--master_port", port, "worker.py", "out")
    result, _ = megalith_run(*args, cwd=job, env=env)
    assert result.returncode == 0, result.stderr
    ranks = read_ranks(job / "out")
    # MASTER_ADDR: each node's store forwarder (launcher/guarded_store.py), on a loopback address
    assert ranks == {0: ["0", "2", "0", "127.0.0.2", "3"], 1: ["1", "2", "0", "127.0.0.1", "3"]}
    assert (job / "fake_ssh.sh.hosts").read_text().split() == ["127.0.0.1"]  # node 0 ran here


@pytest.mark.timeout(75)
def test_failure_on_another_host_is_named(job: Path):
    env = {"MEGALITH_SSH": str(job / "fake_ssh.sh")}
    args = ("--hostfile", "hosts", "--master_port", str(free_port()), "failing.py", "1")
    result, elapsed = megalith_run(*args, cwd=job, env=env)
    assert result.returncode == 3, result.stderr
    assert elapsed < 30
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("megalith run: rank 1 (local_rank 0, pid "), result.stderr
    assert "host 127.0.0.1) failed first, exit code 3: ValueError: shard 7" in last
    assert "MEGALITH_RUN_FAILURES" not in result.stderr


# -- hostfiles and per-host commands (pure) ----------------------------------------------


def test_hostfile_comments_blanks_duplicates():
    text = "# cluster\nw0 slots=4  # fast\n\nw1 slots=2\nw0 slots=4\nw2\n"
    hosts = parse_hostfile_text(text)
    assert [(h.name, h.slots) for h in hosts] == [
        ("w0", (0, 1, 2, 3)),
        ("w1", (0, 1)),
        ("w2", None),
    ]
    with pytest.raises(LaunchError, match=r"hosts:3: w0 is listed again with different slots"):
        parse_hostfile_text("w0 slots=4\nw1\nw0 slots=2\n", source="hosts")
    with pytest.raises(LaunchError, match="expected 'HOST' or 'HOST slots=N'"):
        parse_hostfile_text("w0 slots=four\n")
    with pytest.raises(LaunchError, match="lists no hosts"):
        parse_hostfile_text("# nothing\n\n")


def test_include_exclude_both_forms():
    hosts = parse_hostfile_text("a slots=4\nb slots=4\nc slots=4\n")
    names = lambda hs: [(h.name, h.slots) for h in hs]  # noqa: E731
    assert names(filter_hosts(hosts, "a,c", None)) == names(filter_hosts(hosts, "a@c", None))
    assert names(filter_hosts(hosts, "a:1,3@c", None)) == [("a", (1, 3)), ("c", (0, 1, 2, 3))]
    assert names(filter_hosts(hosts, None, "b")) == [("a", (0, 1, 2, 3)), ("c", (0, 1, 2, 3))]
    kept = [("a", (0, 1, 2, 3)), ("b", (3,)), ("c", (0, 1, 2, 3))]
    assert names(filter_hosts(hosts, None, "b:0,1,2")) == kept
    plans = plan_nodes(filter_hosts(hosts, "a:1,3@c", None), None)
    assert [(p.host, p.node_rank, p.nproc, p.visible_devices) for p in plans] == [
        ("a", 0, "2", "1,3"),
        ("c", 1, "4", None),
    ]
    with pytest.raises(LaunchError, match="b has no slot 7"):
        filter_hosts(hosts, "b:7", None)


def parse(*argv: str):
    return build_parser().parse_args(["run", *argv])


def test_torchrun_flags_reach_torchrun(tmp_path: Path):
    import torch.distributed.run as torchrun

    args = parse(
        *("--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv_endpoint", "h:1"),
        *("--rdzv-id", "job", "--max-restarts", "2", "--monitor_interval", "0.5", "--standalone"),
        *("--nnodes", "1:2", "--no-python", "./train.sh", "--nproc_per_node", "9"),
    )
    (launch,) = plan_launch(args, cwd=str(tmp_path))
    assert launch.command is None
    ns = torchrun.parse_args(launch.run_args)
    assert (ns.nproc_per_node, ns.nnodes, ns.rdzv_backend, ns.rdzv_endpoint) == (
        "2",
        "1:2",
        "c10d",
        "h:1",
    )
    assert (ns.rdzv_id, ns.max_restarts, ns.monitor_interval) == ("job", 2, 0.5)
    assert ns.standalone and ns.no_python and not ns.module
    assert (ns.training_script, ns.training_script_args) == (
        "./train.sh",
        ["--nproc_per_node", "9"],
    )
    ns = torchrun.parse_args(plan_launch(parse("-m", "pkg.train", "--lr", "1"))[0].run_args)
    assert ns.module and (ns.training_script, ns.training_script_args) == (
        "pkg.train",
        ["--lr", "1"],
    )


def test_hostfile_to_per_host_commands(tmp_path: Path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "hosts").write_text("w0 slots=8\nw1 slots=8\nw2 slots=8\n")
    args = parse(
        *("--hostfile", str(tmp_path / "hosts"), "--include", "w0@w2:4,5", "--nproc_per_node", "2"),
        *("--master_port", "4000", "--ssh", "myssh -q", "--ssh-port", "2222", "--env", "FOO,BAR=1"),
        *("--max_restarts", "1", "train.py", "--lr", "0.1"),
    )
    environ = {
        "PATH": "/bin",
        "NCCL_DEBUG": "INFO",
        "FOO": "x y",
        "HOME": "/root",
        "PYTHONPATH": "/p",
    }
    launches = plan_launch(args, environ=environ, cwd=str(tmp_path), local=lambda host: False)
    assert [launch.plan.host for launch in launches] == ["w0", "w2"]
    for rank, launch in enumerate(launches):
        command = launch.command
        assert command[:5] == ["myssh", "-q", "-p", "2222", launch.plan.host]
        words = shlex.split(command[5])
        assert words[:8] == ["echo", STARTED, "&&", "cd", str(tmp_path), "&&", "exec", "env"]
        env = dict(w.split("=", 1) for w in words[5:] if "=" in w and not w.startswith("-"))
        assert {k: env.get(k) for k in ("PATH", "NCCL_DEBUG", "FOO", "BAR", "PYTHONPATH")} == {
            "PATH": "/bin",
            "NCCL_DEBUG": "INFO",
            "FOO": "x y",
            "BAR": "1",
            "PYTHONPATH": "/p",
        }
        assert "HOME" not in env
        assert env.get("CUDA_VISIBLE_DEVICES") == (None, "4,5")[rank]
        run_args = words[words.index("run") + 1 :]
        assert run_args == launch.run_args
        options = dict(zip(run_args[: launch.split : 2], run_args[1 : launch.split : 2]))
        assert options["--nnodes"] == "2" and options["--node_rank"] == str(rank)
        assert (options["--master_addr"], options["--master_port"]) == ("w0", "4000")
        assert (options["--nproc_per_node"], options["--max_restarts"]) == ("2", "1")
        assert run_args[launch.split :] == ["train.py", "--lr", "0.1"]
    node0 = plan_launch(args, environ=environ, cwd=str(tmp_path), local=lambda host: host == "w0")
    assert node0[0].command[:2] == ["/bin/sh", "-c"] and node0[1].command[0] == "myssh"


def test_first_failure_ranks_survivors_last():
    stopped = Failure(rank=0, local_rank=0, pid=10, exitcode=-15, timestamp=5)
    lost = Failure(0, 0, 10, 1, tail=["RuntimeError: Connection closed by peer"], timestamp=5)
    culprit = Failure(rank=1, local_rank=1, pid=11, exitcode=3, tail=["boom"], timestamp=6)
    assert first_failure([stopped, culprit]) is culprit
    assert first_failure([lost, culprit]) is culprit
    lines = summary([stopped, culprit])
    assert (
        lines[-1] == "megalith run: rank 1 (local_rank 1, pid 11) failed first, exit code 3: boom"
    )


# -- bad arguments ---------------------------------------------------------------------

BAD = [
    (["--nproc_per_node", "0", "x.py"], "--nproc_per_node '0': give a positive number"),
    (["--nproc_per_node", "many", "x.py"], "give a positive number of processes per node"),
    (["--host", "a", "--hostfile", "h", "x.py"], "--host and --hostfile exclude each other"),
    (["--hostfile", "missing", "x.py"], "hostfile missing not found: pass --hostfile FILE"),
    (["--hostfile", "empty", "x.py"], "lists no hosts: add lines 'HOST slots=N'"),
    (["--hostfile", "h", "--include", "zz:0", "x.py"], "--include: unknown host 'zz'; the hosts"),
    (["--hostfile", "h", "--nproc_per_node", "3", "x.py"], "3 exceeds the slots of a (slots=2)"),
    (["--hostfile", "h", "--include", "a", "--exclude", "b", "x.py"], "mutually exclusive"),
    (["--exclude", "a", "x.py"], "--exclude selects from --hostfile or --host"),
    (["--host", "a,b", "--master_addr", "127.0.0.1", "x.py"], "loopback address"),
    (["--hostfile", "h", "--node_rank", "1", "x.py"], "--node_rank is set per host"),
    (["--nproc_per_node", "2", "nothere.py"], "script nothere.py not found"),
    (["-m", "--no_python", "pkg"], "-m/--module and --no_python exclude each other"),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[m.split(":")[0][:30] for _, m in BAD])
def test_bad_arguments(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("")
    (tmp_path / "h").write_text("a slots=2\nb slots=2\n")
    (tmp_path / "empty").write_text("# no hosts yet\n")
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("megalith run: error: ") and message in err, err
