"""The guarded rendezvous store (megalith_comm.store_guard, launcher/guarded_store): bound to
the address asked for only; a client without the job's key is refused, one through the
forwarder (this user) works, another user is turned away by the forwarder."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from megalith.testing import free_port
from megalith_comm.store_guard import Forwarder, guarded_listener, md5_key
from tests.cli.test_launcher import megalith_run

pytestmark = pytest.mark.timeout(60)


def refused(addr: str, port: int, seconds: float = 1.0) -> bool:
    """Whether a plain (unsigned) TCP connection to addr:port fails."""
    try:
        socket.create_connection((addr, port), timeout=seconds).close()
    except OSError:
        return True
    return False


@pytest.fixture
def guarded():
    key = md5_key(os.urandom(8).hex())
    port = free_port()
    listener = guarded_listener("127.0.0.1", port, key)
    forwarder = Forwarder(("127.0.0.1", port), key, "127.0.0.2", port)
    store = dist.TCPStore("127.0.0.2", port, None, True, timedelta(seconds=10),
                          wait_for_workers=False, master_listen_fd=listener.detach())  # fmt: skip
    yield store, forwarder, port
    forwarder.close()


def test_unsigned_clients_are_refused_and_the_forwarder_admits_this_user(guarded):
    store, forwarder, port = guarded
    value = torch.randn(4).numpy().tobytes()
    store.set("secret", value)
    assert refused("127.0.0.1", port)  # no key: the kernel drops the SYN
    assert refused("127.0.0.3", port)  # bound to 127.0.0.1 only
    client = dist.TCPStore("127.0.0.2", forwarder.port, None, False, timedelta(seconds=5))
    assert client.get("secret") == value


SYSTEM_PYTHON = "/usr/bin/python3"  # one that user nobody may run (the venv's may not be)


@pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("runuser") or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root, runuser and /usr/bin/python3 to act as another user",
)
def test_the_forwarder_turns_away_another_user(guarded):
    _, forwarder, _ = guarded
    probe = (
        f"import socket; s = socket.create_connection(('127.0.0.2', {forwarder.port}), "
        "timeout=5); s.sendall(b'x'); print(repr(s.recv(1)))"
    )
    result = subprocess.run(["runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-S", "-c", probe],
                            capture_output=True, text=True, timeout=20)  # fmt: skip
    assert result.stdout.strip() == "b''" or "reset" in result.stderr.lower(), result
    assert forwarder.refused == 1


PROBE = """
import os, socket, sys, torch, torch.distributed as dist
port = int(sys.argv[1])
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
try:
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    direct = "connected"
except OSError:
    direct = "refused"
print(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], direct, "%g" % t.item())
"""


@pytest.mark.timeout(75)
def test_megalith_run_ranks_reach_the_store_only_through_the_forwarder(tmp_path: Path):
    (tmp_path / "probe.py").write_text(PROBE)
    port = str(free_port())
    result, _ = megalith_run("--nproc_per_node", "2", "--master_port", port, "probe.py", port,
                             cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = sorted(result.stdout.splitlines())
    assert lines == [f"[rank{r}]:127.0.0.2 {port} refused 3" for r in (0, 1)], result.stdout


def test_a_kernel_without_signatures_keeps_torchs_store_and_says_so(monkeypatch, capsys):
    from megalith.launcher import guarded_store

    monkeypatch.setattr(guarded_store, "signatures_supported", lambda: False)
    argv = ["--nproc_per_node", "2", "train.py", "--lr", "1"]
    assert guarded_store.guarded_argv(argv, 2, "token") == (argv, 2, "")
    assert "no TCP MD5 signatures" in capsys.readouterr().err
