"""`megalith run --hostfile` over real OpenSSH, between network namespaces.

tests/support/netns.py builds two "hosts" on this machine, each a network
namespace with its own address (10.77.0.1, 10.77.0.2) and its own sshd; the
launcher runs in a third namespace (the hub, 10.77.0.254), so every node, node 0
included, is started over ssh and all traffic between them crosses the veths.
The ranks find python as a user's would: the launcher's interpreter path and
PATH travel on the ssh command line.

Needs root, `ip netns` and sshd (Debian: apt-get install -y openssh-server);
skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megalith.launcher.ssh import SSH_OPTIONS, NodeProcesses, pin_gloo_interface, ssh_prefix
from tests.support.netns import Network, unavailable

WHY_NOT = unavailable()
needs_network = pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespace network: {WHY_NOT}")

WORKER = Path(__file__).with_name("netns_worker.py")
COMM_TIMEOUT_S = 4  # MEGALITH_COMM_TIMEOUT of the link-down run
# Keepalives faster than the launcher's defaults: the dead node's ssh gives up in ~2 s.
LONG_RUN = ("worker.py", "out", "100000", "0.05")  # steps until stopped
FAST_KEEPALIVE = "-o ServerAliveInterval=1 -o ServerAliveCountMax=2"


@pytest.fixture(scope="module")
def network(tmp_path_factory, request) -> Network:
    net = Network(tmp_path_factory.mktemp("netns"), count=2)
    request.addfinalizer(net.close)  # before up(): a half-built network is removed too
    return net.up()


@pytest.fixture
def job(tmp_path: Path, network: Network):
    shutil.copy(WORKER, tmp_path / "worker.py")
    hosts = "".join(f"{node.address} slots=2\n" for node in network.nodes)
    (tmp_path / "hosts").write_text(hosts)
    (tmp_path / "out").mkdir()
    yield tmp_path
    network.kill_jobs()  # whatever a failed test left running on the nodes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(network: Network | None, job: Path, *args: str, env: dict | None = None):
    """`megalith run ARGS` in the hub namespace (network None: here), in its own group."""
    argv = [sys.executable, "-m", "megalith", "run", *args]
    return subprocess.Popen(
        network.in_hub(argv) if network else argv,
        cwd=job,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"megalith run hung for {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def over_ssh(network: Network, *extra: str) -> tuple[str, ...]:
    return ("--hostfile", "hosts", "--ssh", f"ssh -F {network.ssh_config} {' '.join(extra)}")


def wait_for_step(proc: subprocess.Popen, job: Path, step: int, timeout: float = 45) -> None:
    deadline = time.monotonic() + timeout
    while not (job / "out" / f"step{step}").exists():
        assert proc.poll() is None, finish(proc, 5).stderr
        assert time.monotonic() < deadline, f"the job did not reach step {step} in {timeout} s"
        time.sleep(0.1)


def launcher_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("megalith run:")]


@needs_network
@pytest.mark.timeout(90)
def test_two_nodes_of_two_train_like_one_node_of_four(network: Network, job: Path):
    steps = "4"
    (job / "alone").mkdir()
    # Side by side, to share the two cores' idle time (imports, rendezvous, teardown).
    spread = start(network, job, *over_ssh(network), "worker.py", "out", steps)
    port = str(free_port())
    alone = start(
        None, job, "--nproc_per_node", "4", "--master_port", port, "worker.py", "alone", steps
    )
    two_nodes, one_node = finish(spread, 75), finish(alone, 75)
    assert two_nodes.returncode == 0, two_nodes.stderr
    assert one_node.returncode == 0, one_node.stderr
    ranks = {r: json.loads((job / "out" / f"rank{r}.json").read_text()) for r in range(4)}
    here = os.readlink("/proc/self/ns/net")
    for rank, where in ranks.items():
        # The ranks reach the store through their node's guarding forwarder (loopback);
        # it, and Gloo, go over the namespace's own address.
        assert where["master"].startswith("127."), where
        assert where["gloo_interface"] == "eth0", where  # [Note: Gloo's address]
        assert where["netns"] == ranks[2 * (rank // 2)]["netns"] != here
    assert ranks[0]["netns"] != ranks[2]["netns"]
    assert "the rendezvous store listens on 10.77.0.1:" in two_nodes.stdout + two_nodes.stderr
    for i in range(2):  # started by that node's own sshd, from the hub
        assert "Accepted publickey for root from 10.77.0.254" in network.sshd_log(i)
    losses = json.loads((job / "out" / "losses.json").read_text())
    assert len(losses) == int(steps) and len(set(losses)) == len(losses) and min(losses) > 0
    # Same world size, so the same Gloo reduction order: bit-equal, not just close.
    assert losses == json.loads((job / "alone" / "losses.json").read_text())


@needs_network
@pytest.mark.timeout(90)
def test_link_down_mid_run_ends_the_job_naming_the_node(network: Network, job: Path):
    args = (*over_ssh(network, FAST_KEEPALIVE), "--nproc_per_node", "1")
    env = {"MEGALITH_COMM_TIMEOUT": str(COMM_TIMEOUT_S)}
    proc = start(network, job, *args, *LONG_RUN, env=env)
    try:
        wait_for_step(proc, job, 2)
        network.set_link(1, up=False)
        cut = time.monotonic()
        result = finish(proc, COMM_TIMEOUT_S + 30)
        ended = time.monotonic() - cut
    finally:
        network.set_link(1, up=True)
    lines = launcher_lines(result.stderr)
    assert result.returncode != 0, result.stderr
    assert ended < COMM_TIMEOUT_S + 6, (ended, result.stderr)
    assert any("node 1 (10.77.0.2)" in line for line in lines), result.stderr


@needs_network
@pytest.mark.timeout(60)
def test_node_without_sshd_is_named_in_one_line_within_10_s(network: Network, job: Path):
    network.stop_sshd(1)
    try:
        began = time.monotonic()
        result = finish(start(network, job, *over_ssh(network), "worker.py", "out", "2"), 20)
        took = time.monotonic() - began
    finally:
        network.start_sshd(1)
    assert result.returncode == 255, result.stderr
    assert took < 10, (took, result.stderr)
    (line,) = launcher_lines(result.stderr)
    assert line == result.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "megalith run: error: cannot start the node on 10.77.0.2: ssh: connect to host "
        "10.77.0.2 port 22: Connection refused; check that `ssh 10.77.0.2 true` works"
    ), result.stderr


@needs_network
@pytest.mark.timeout(90)
def test_launcher_killed_mid_run_leaves_no_rank_on_any_node(network: Network, job: Path):
    proc = start(network, job, *over_ssh(network), "--nproc_per_node", "1", *LONG_RUN)
    wait_for_step(proc, job, 2)
    os.kill(proc.pid, signal.SIGKILL)  # the launcher alone: its ssh clients see stdin end
    proc.communicate()
    deadline = time.monotonic() + 5
    while (left := network.jobs_left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running 5 s after the launcher died: {left}"


# -- the launcher's side, without a network ------------------------------------------


@pytest.mark.timeout(10)
def test_ssh_options_come_after_the_users_so_the_users_win():
    given = ssh_prefix("ssh -F cfg -o ConnectTimeout=30", port=2222)
    assert given[:4] == ["ssh", "-F", "cfg", "-o"] and given[-2:] == ["-p", "2222"]
    assert given[5:-2] == [word for option in SSH_OPTIONS for word in ("-o", option)]
    # ssh keeps the first value of an option: the user's ConnectTimeout=30 wins over ours
    assert given.index("ConnectTimeout=30") < given.index("ConnectTimeout=5")
    assert ssh_prefix("/opt/wrap/myssh -q") == ["/opt/wrap/myssh", "-q"]  # not OpenSSH: as given


@pytest.mark.timeout(10)
def test_gloo_interface_is_left_alone_for_loopback_or_when_set():
    env = {}
    assert pin_gloo_interface("127.0.0.1", env) is None and env == {}
    env = {"GLOO_SOCKET_IFNAME": "ib0"}
    assert pin_gloo_interface("10.77.0.1", env) is None and env == {"GLOO_SOCKET_IFNAME": "ib0"}


NODE = """
import sys, time
from megalith.launcher.ssh import stop_with_launcher
handed = stop_with_launcher(handover=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(handed)
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


@pytest.mark.timeout(30)
def test_a_node_reads_its_handover_then_stops_when_its_lifeline_ends(tmp_path: Path):
    token, got = secrets.token_hex(8), tmp_path / "got"
    procs = NodeProcesses({"h": [sys.executable, "-c", NODE, str(got)]}, handover=token)
    procs.start()
    deadline = time.monotonic() + 15
    while not got.exists():
        assert procs.running() and time.monotonic() < deadline, "the node never read its line"
        time.sleep(0.05)
    assert got.read_text() == token and token not in " ".join(procs.commands["h"])
    began = time.monotonic()
    procs.procs["h"].stdin.close()  # what the node sees when its launcher dies
    assert procs.wait(5), "the node outlived its lifeline"
    assert procs.procs["h"].returncode == -signal.SIGTERM and time.monotonic() - began < 5
