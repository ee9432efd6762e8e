"""Starting the other nodes of a multi-host run over ssh, and watching them.

Each other host runs `python -m megalith run` (the same interpreter path as
here: clusters share the environment) in this directory, with --nnodes,
--node_rank, --master_addr and --master_port filled in and the environment
variables that must travel set on its command line. The ssh command is
--ssh or MEGALITH_SSH (default "ssh"); it is called as
`<ssh> [-p PORT] HOST COMMAND`, so a test can put a local shell in its place.

When that command is OpenSSH's ssh, the launcher adds SSH_OPTIONS after the
user's words: no password prompt (a launch has no terminal to ask on), a
connect timeout so an unreachable host fails in seconds, and keepalives so a
node whose network dies is noticed. ssh keeps the first value it gets for an
option, so the same -o in --ssh wins over these (they in turn win over
~/.ssh/config; host keys, users and identities stay the config's business).

A node prints STARTED first thing; one that ends without it never ran (ssh
could not connect or log in), and `unstarted()` says so in one line naming
the host and ssh's reason, so the launcher can stop at once instead of
waiting on the other nodes.

A remote node prints its failures as one MARKER line on stderr (see
report.encode); the forwarding threads here keep those lines and pass every
other line through to this terminal.

[Note: the lifeline] Each node's stdin is a pipe from this launcher that is
never written. A node (`megalith run --report-failures`) watches it
(stop_with_launcher): when it ends, because the launcher stopped the node,
exited or was killed (even by SIGKILL), or because ssh's connection closed and
sshd closed the remote command's stdin, the node SIGTERMs itself and its agent
stops the ranks. So no node trains on after its launcher is gone. A node whose
network died gets no such word; its ranks stop at the collective timeout.
The same pipe can hand each node one line first (NodeProcesses' handover, read
by stop_with_launcher(handover=True)): a secret such as the store's token goes
there, inside ssh's encrypted channel, never on a command line.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping, MutableMapping, Sequence
from typing import IO

from megalith.launcher.hostfile import NodePlan
from megalith.launcher.report import Failure, decode

DEFAULT_SSH = "ssh"
SSH_OPTIONS = (
    "BatchMode=yes",
    "ConnectTimeout=5",
    "ServerAliveInterval=5",
    "ServerAliveCountMax=3",
)
STARTED = "MEGALITH_RUN_NODE_STARTED"
# OMP_ / MKL_: thread counts and MKL's reproducibility mode, the same on every node (a
# node without MKL_CBWR computes GEMMs by other paths than one with it)
TRAVEL_PREFIXES = ("MEGALITH_", "NCCL_", "CUDA_", "PYTHON", "OMP_", "MKL_")
TRAVEL_NAMES = ("PATH",)


def travelling_env(environ: Mapping[str, str], extra: Sequence[str] = ()) -> dict[str, str]:
    """The variables a remote node gets: MEGALITH_*, NCCL_*, CUDA_*, PYTHON*, OMP_*, MKL_*,
    PATH, and each --env entry (NAME: its value here; NAME=VALUE: that value)."""
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
    if os.path.basename(words[0]) == "ssh":
        words += [word for option in SSH_OPTIONS for word in ("-o", option)]
    return words + (["-p", str(port)] if port else [])


def remote_command(
    plan: NodePlan,
    run_args: list[str],
    env: Mapping[str, str],
    cwd: str,
    python: str = sys.executable,
) -> str:
    """The shell line a remote host runs: STARTED, cd, then exec megalith run with its env."""
    env = dict(env)
    if plan.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = plan.visible_devices
    assignments = [f"{key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    argv = [python, "-m", "megalith", "run", *run_args]
    words = ["echo", STARTED, "&&", "cd", shlex.quote(cwd), "&&", "exec", "env", *assignments]
    return " ".join([*words, *map(shlex.quote, argv)])


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


SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def source_address(host: str) -> str | None:
    """This machine's address towards host (the kernel's route; a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), 9))
            return probe.getsockname()[0]
    except OSError:
        return None


def interface_with(address: str) -> str | None:
    """The name of the interface whose IPv4 address is address (None: none, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(reply[20:24]) == address:
                return name
    return None


def pin_gloo_interface(master_addr: str | None, environ: MutableMapping[str, str] = os.environ):
    """Sets GLOO_SOCKET_IFNAME to the interface that reaches master_addr, unless it is set.

    [Note: Gloo's address] Without GLOO_SOCKET_IFNAME each rank tells its peers
    the address its host name resolves to, which on many hosts (Debian's
    /etc/hosts, containers) is 127.0.x.x: the ranks of other nodes then connect
    to themselves and the job fails in init ("Connection refused,
    remote=[127.0.0.1]"). The interface the kernel routes to node 0 by is the one
    the other nodes can reach this one on. Returns the name set, or None.
    """
    if not master_addr or is_loopback(master_addr) or "GLOO_SOCKET_IFNAME" in environ:
        return None
    source = source_address(master_addr)
    name = interface_with(source) if source and not is_loopback(source) else None
    if name:
        environ["GLOO_SOCKET_IFNAME"] = name
    return name


def stop_with_launcher(handover: bool = False) -> str:
    """On a node: SIGTERM this process when stdin, its launcher's lifeline, ends.

    Only when stdin is a pipe or socket (a node's, see [Note: the lifeline]).
    handover: first read the one line the launcher hands over (its handover) and
    return it; "" otherwise, or when stdin is not a lifeline."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return ""
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return ""
    line = bytearray()
    while handover and (byte := os.read(0, 1)) not in (b"", b"\n"):  # unbuffered: one line
        line += byte

    def watch() -> None:
        while True:
            try:
                if not os.read(0, 4096):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        os.kill(os.getpid(), signal.SIGTERM)  # the agent stops the ranks

    threading.Thread(target=watch, name="megalith-lifeline", daemon=True).start()
    return line.decode()


class NodeProcesses:
    """One `megalith run` per node (over ssh, or directly for this machine), started
    together; their output is passed through and their failure reports kept."""

    def __init__(self, commands: dict[str, list[str]], handover: str = ""):
        if "\n" in handover:
            raise ValueError("the handover to the nodes is one line: it holds a newline")
        self.commands = commands
        self.handover = handover  # the line each node reads first ([Note: the lifeline])
        self.procs: dict[str, subprocess.Popen] = {}
        self.failures: list[Failure] = []
        self.last_line: dict[str, str] = {}
        self.started: set[str] = set()  # hosts whose command printed STARTED
        self._threads: dict[str, list[threading.Thread]] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        for host, argv in self.commands.items():
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,  # [Note: the lifeline]: never written, closed to stop
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            self.procs[host] = proc
            if self.handover:
                try:
                    proc.stdin.write(self.handover.encode() + b"\n")
                    proc.stdin.flush()
                except BrokenPipeError:
                    pass  # it ended already: unstarted() or failed() tell why
            for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                thread = threading.Thread(
                    target=self._forward, args=(host, stream, sink), daemon=True
                )
                thread.start()
                self._threads.setdefault(host, []).append(thread)

    def _forward(self, host: str, stream: IO[bytes], sink: IO[str]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            found = decode(line, host)
            with self._lock:
                if line == STARTED:
                    self.started.add(host)
                    continue
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
        for threads in self._threads.values():
            for thread in threads:
                thread.join(5)
        return True

    def unstarted(self) -> list[str]:
        """One line per node that ended before its command ran: the host and ssh's reason."""
        lines = []
        for host, proc in self.procs.items():
            if proc.poll() is None or host in self.started:
                continue
            for thread in self._threads.get(host, []):
                thread.join(2)  # its last lines (ssh's reason) are read by now
            if host in self.started:
                continue
            why = self.last_line.get(host) or f"exit status {proc.returncode}, no output"
            lines.append(
                f"cannot start the node on {host}: {why}; check that `ssh {host} true` "
                "works from here without a prompt (sshd running, key and host key known)"
            )
        return lines

    def stop(self, grace: float = 10.0) -> None:
        """Ends each node's lifeline and SIGTERMs its ssh client; SIGKILL after grace seconds."""
        for proc in self.procs.values():
            if proc.stdin is not None and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except BrokenPipeError:  # the ssh client already died (e.g. no sshd there)
                    pass
            if proc.poll() is None:
                proc.terminate()
        if not self.wait(grace):
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
            self.wait(5)
