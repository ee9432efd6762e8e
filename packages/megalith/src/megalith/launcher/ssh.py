"""Starting the other nodes of a multi-host run over ssh, and watching them.

Each other host runs `python -m megalith run` (the same interpreter path as
here: clusters share the environment) in this directory, with --nnodes,
--node_rank, --master_addr and --master_port filled in and the environment
variables that must travel set on its command line. The ssh command is
MEGALITH_SSH or --ssh (default "ssh -o BatchMode=yes"); it is called as
`<ssh> [-p PORT] HOST COMMAND`, so a test can put a local shell in its place.

A remote node prints its failures as one MARKER line on stderr (see
report.encode); the forwarding threads here keep those lines and pass every
other line through to this terminal.

Stopping a node stops its ssh client. Whether that stops the job on the remote
host is ssh's business: with a tty (--ssh "ssh -tt") sshd hangs the remote
command up; without one the remote ranks stop when their collectives lose the
ranks that did stop, as after any other failure.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO

from megalith.launcher.hostfile import NodePlan
from megalith.launcher.report import Failure, decode

DEFAULT_SSH = "ssh -o BatchMode=yes"
TRAVEL_PREFIXES = ("MEGALITH_", "NCCL_", "CUDA_", "PYTHON")
TRAVEL_NAMES = ("PATH",)


def travelling_env(environ: Mapping[str, str], extra: Sequence[str] = ()) -> dict[str, str]:
    """The variables a remote node gets: MEGALITH_*, NCCL_*, CUDA_*, PYTHON*, PATH, and
    each --env entry (NAME: its value here; NAME=VALUE: that value)."""
    env = {
        key: value
        for key, value in environ.items()
        if (key.startswith(TRAVEL_PREFIXES) or key in TRAVEL_NAMES) and "\n" not in value
    }
    for entry in extra:
        for item in (part.strip() for part in entry.split(",")):
            name, eq, value = item.partition("=")
            if eq:
                env[name] = value
            elif name in environ:
                env[name] = environ[name]
    env.pop("MEGALITH_SSH", None)
    return env


def ssh_prefix(ssh: str | None = None, port: int | None = None) -> list[str]:
    words = shlex.split(ssh or os.environ.get("MEGALITH_SSH") or DEFAULT_SSH)
    return words + (["-p", str(port)] if port else [])


def remote_command(
    plan: NodePlan,
    run_args: list[str],
    env: Mapping[str, str],
    cwd: str,
    python: str = sys.executable,
) -> str:
    """The shell line a remote host runs: cd, then exec megalith run with its env."""
    env = dict(env)
    if plan.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = plan.visible_devices
    assignments = [f"{key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    argv = [python, "-m", "megalith", "run", *run_args]
    return " ".join(
        ["cd", shlex.quote(cwd), "&&", "exec", "env", *assignments, *map(shlex.quote, argv)]
    )


def ssh_command(host: str, command: str, ssh: str | None = None, port: int | None = None):
    return [*ssh_prefix(ssh, port), host, command]


def is_local(host: str) -> bool:
    """Whether host names this machine (a loopback address, its name or one of its addresses)."""
    if host in ("localhost", "::1") or host.startswith("127."):
        return True
    if host in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        address = socket.gethostbyname(host)
        mine = set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        return False
    return address.startswith("127.") or address in mine


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class NodeProcesses:
    """One `megalith run` per node (over ssh, or directly for this machine), started
    together; their output is passed through and their failure reports kept."""

    def __init__(self, commands: dict[str, list[str]]):
        self.commands = commands
        self.procs: dict[str, subprocess.Popen] = {}
        self.failures: list[Failure] = []
        self.last_line: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        for host, argv in self.commands.items():
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            self.procs[host] = proc
            for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                thread = threading.Thread(
                    target=self._forward, args=(host, stream, sink), daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _forward(self, host: str, stream: IO[bytes], sink: IO[str]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            found = decode(line, host)
            with self._lock:
                if found is not None:
                    self.failures.extend(found)
                    continue
                if line.strip():
                    self.last_line[host] = line.strip()
                sink.write(line + "\n")  # under the lock: whole lines, never interleaved
                sink.flush()

    def running(self) -> bool:
        return any(proc.poll() is None for proc in self.procs.values())

    def failed(self) -> dict[str, int]:
        """host -> exit status, for the nodes that have exited non-zero so far."""
        codes = {host: proc.poll() for host, proc in self.procs.items()}
        return {host: code for host, code in codes.items() if code}

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for every node (True) or until timeout (False)."""
        try:
            for proc in self.procs.values():
                proc.wait(timeout)  # timeout per node: an upper bound is all we need
        except subprocess.TimeoutExpired:
            return False
        for thread in self._threads:
            thread.join(5)
        return True

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to the ssh processes still running, SIGKILL after grace seconds."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        if not self.wait(grace):
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
            self.wait(5)
