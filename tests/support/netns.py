"""A small network of "hosts" on this machine: network namespaces, each with an OpenSSH server.

    hub (namespace <tag>-hub): bridge br0, 10.77.0.254/24; the launcher runs here
     |-- veth -- <tag>-n0: eth0 10.77.0.1, sshd on 10.77.0.1:22
     '-- veth -- <tag>-n1: eth0 10.77.0.2, sshd on 10.77.0.2:22

Every interface, the bridge included, lives in a namespace of its own making, so
the machine's own network is never touched and two runs do not collide (their
namespaces differ by tag; the subnet repeats, but inside separate namespaces).
Keys (host and user), known_hosts and an ssh_config are written into a temp dir;
sshd runs with its own config (-f) and -D, no system file is read or changed.
The one exception is sshd's privilege-separation directory (/run/sshd, compiled
into sshd): it is created when missing and removed again by close().

`Network.close()` kills every process left in the namespaces (`ip netns pids`)
and deletes them; call it from a finalizer so a failed test cleans up too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.77.0"
HUB_ADDRESS = f"{SUBNET}.254"
STEP_TIMEOUT_S = 10.0  # each ip / ssh-keygen call
SSHD_START_S = 10.0
PRIVSEP_DIR = Path("/run/sshd")

SSHD_CONFIG = """\
ListenAddress {address}:22
HostKey {dir}/host_ed25519
AuthorizedKeysFile {dir}/authorized_keys
PidFile none
UsePAM no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
LogLevel INFO
"""
SSH_CONFIG = """\
Host {subnet}.*
    User root
    IdentityFile {dir}/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile {dir}/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
"""


def unavailable() -> str | None:
    """Why this machine cannot host the network (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and sshd)"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if sshd_path() is None:
        return "sshd is missing: apt-get install -y openssh-server"
    probe = f"mlprobe{os.getpid()}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    _run(["ip", "netns", "delete", probe], check=False)
    return None


def sshd_path() -> str | None:
    return shutil.which("sshd") or next(
        (p for p in ("/usr/sbin/sshd", "/sbin/sshd") if os.access(p, os.X_OK)), None
    )


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@dataclass
class Node:
    namespace: str
    address: str
    sshd: subprocess.Popen | None = None


@dataclass
class Network:
    root: Path  # temp dir for keys and configs
    count: int = 2
    tag: str = field(default_factory=lambda: f"ml{os.getpid()}")
    nodes: list[Node] = field(default_factory=list)
    _made_privsep: bool = False

    @property
    def hub(self) -> str:
        return f"{self.tag}-hub"

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    def in_hub(self, argv: list[str]) -> list[str]:
        """argv run inside the hub namespace (where the launcher runs)."""
        return ["ip", "netns", "exec", self.hub, *argv]

    def up(self) -> Network:
        self.root.mkdir(parents=True, exist_ok=True)
        self._keys()
        _run(["ip", "netns", "add", self.hub])
        hub = ["ip", "-n", self.hub]
        _run([*hub, "link", "set", "lo", "up"])
        _run([*hub, "link", "add", "br0", "type", "bridge"])
        _run([*hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0"])
        _run([*hub, "link", "set", "br0", "up"])
        known = []
        for i in range(self.count):
            node = Node(f"{self.tag}-n{i}", f"{SUBNET}.{i + 1}")
            self.nodes.append(node)
            _run(["ip", "netns", "add", node.namespace])
            inner = ["ip", "-n", node.namespace]
            peer = ["peer", "name", "eth0", "netns", node.namespace]
            _run([*hub, "link", "add", f"port{i}", "type", "veth", *peer])
            _run([*hub, "link", "set", f"port{i}", "master", "br0", "up"])
            _run([*inner, "addr", "add", f"{node.address}/24", "dev", "eth0"])
            _run([*inner, "link", "set", "eth0", "up"])
            _run([*inner, "link", "set", "lo", "up"])
            known.append(f"{node.address} {(self.root / 'host_ed25519.pub').read_text()}")
        (self.root / "known_hosts").write_text("".join(known))
        if not PRIVSEP_DIR.exists():
            PRIVSEP_DIR.mkdir(mode=0o755)
            self._made_privsep = True
        for i in range(self.count):
            self.start_sshd(i)
        return self

    def _keys(self) -> None:
        for name in ("host_ed25519", "id_ed25519"):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / name)])
        user_key = (self.root / "id_ed25519.pub").read_text()
        (self.root / "authorized_keys").write_text(user_key)
        (self.root / "authorized_keys").chmod(0o600)
        self.ssh_config.write_text(SSH_CONFIG.format(subnet=SUBNET, dir=self.root))

    def start_sshd(self, i: int) -> None:
        """sshd in node i's namespace; returns once it listens."""
        node = self.nodes[i]
        config = self.root / f"sshd_config{i}"
        config.write_text(SSHD_CONFIG.format(address=node.address, dir=self.root))
        log = self.root / f"sshd{i}.{len(list(self.root.glob(f'sshd{i}.*.log')))}.log"
        argv = ["ip", "netns", "exec", node.namespace, sshd_path(), "-D", "-e", "-f", str(config)]
        with log.open("w") as sink:  # sshd -e logs to stderr: a file, so it never blocks
            node.sshd = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=sink)
        deadline = time.monotonic() + SSHD_START_S
        while time.monotonic() < deadline and node.sshd.poll() is None:
            if "Server listening on" in log.read_text():
                return
            time.sleep(0.02)
        self.stop_sshd(i)
        raise RuntimeError(f"sshd in {node.namespace} did not start: {log.read_text().strip()}")

    def sshd_log(self, i: int) -> str:
        """What node i's sshd logged, over all its starts."""
        return "".join(log.read_text() for log in sorted(self.root.glob(f"sshd{i}.*.log")))

    def stop_sshd(self, i: int) -> None:
        proc = self.nodes[i].sshd
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.nodes[i].sshd = None

    def set_link(self, i: int, up: bool) -> None:
        state = "up" if up else "down"
        _run(["ip", "-n", self.nodes[i].namespace, "link", "set", "eth0", state])

    def jobs_left(self) -> dict[str, list[int]]:
        """namespace -> pids of the processes in it other than its sshd (none: left out)."""
        keep = {node.sshd.pid for node in self.nodes if node.sshd is not None}
        left = {}
        for namespace in [node.namespace for node in self.nodes] + [self.hub]:
            pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
            if mine := [pid for pid in map(int, pids) if pid not in keep]:
                left[namespace] = mine
        return left

    def kill_jobs(self) -> None:
        """SIGKILL to every process in the namespaces but the sshd."""
        for pids in self.jobs_left().values():
            for pid in pids:
                _kill(pid)

    def close(self) -> None:
        for i in range(len(self.nodes)):
            self.stop_sshd(i)
        self.kill_jobs()
        for namespace in [node.namespace for node in self.nodes] + [self.hub]:
            _run(["ip", "netns", "delete", namespace], check=False)
        if self._made_privsep:
            shutil.rmtree(PRIVSEP_DIR, ignore_errors=True)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
