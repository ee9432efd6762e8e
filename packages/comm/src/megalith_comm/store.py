"""The rendezvous store: who hosts it, binding it to MASTER_ADDR, and checking in.

Two cases:
- Rank 0 hosts a TCPStore. It opens the listening socket itself, bound to
  MASTER_ADDR only, and hands it to torch (`master_listen_fd`): torch 2.13 binds its
  own socket to every interface (`*:port`) whatever host name it is given. (torch
  builds without `master_listen_fd` get torch's own binding, on all interfaces,
  and a warning.)
- Under torch's elastic agent (torchrun, `megalith run`) the agent already hosts a
  store on MASTER_ADDR:MASTER_PORT and says so with TORCHELASTIC_USE_AGENT_STORE=True
  (as torch.distributed's env:// init reads it): every rank connects as a client,
  and keys go under a prefix per run and restart so a restarted job starts clean.
  Binding that store is the agent's business.

Every rank then checks in under `megalith_comm/arrived/<rank>`; rank 0 waits until
all have, so a rank that never comes makes init fail within the timeout, saying how
many of how many arrived and which are missing.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .errors import CommError
from .launch_env import LaunchConfig

PREFIX = "megalith_comm/"


@dataclass(frozen=True)
class StoreSpec:
    """How to reach the store: address, who hosts it (0: rank 0; None: the launcher's
    agent), the key prefix (None: none), the timeout in seconds."""

    addr: str
    port: int
    host_rank: int | None
    prefix: str | None
    timeout: float

    def client(self, timeout: float | None = None) -> Any:
        """A new connection to the store (the heartbeat thread has its own); `timeout`
        (seconds) instead of the job's."""
        seconds = self.timeout if timeout is None else timeout
        raw = dist.TCPStore(self.addr, self.port, None, False, timedelta(seconds=seconds))
        return dist.PrefixStore(self.prefix, raw) if self.prefix else raw

    def describe(self) -> str:
        who = "rank 0" if self.host_rank == 0 else "the launcher's agent"
        return f"the rendezvous store on {who} ({self.addr}:{self.port})"


def agent_store() -> bool:
    """Whether torch's elastic agent hosts the store (torchrun, megalith run)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "") == "True"


def listen(addr: str, port: int) -> socket.socket:
    """A listening socket bound to addr:port only (not to every interface)."""
    errors = []
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(2048)
            return sock
        except OSError as exc:
            sock.close()
            errors.append(f"{sockaddr[0]}: {exc}")
    raise CommError(
        f"rank 0 cannot listen on MASTER_ADDR:MASTER_PORT = {addr}:{port} ({'; '.join(errors)}): "
        "is the port already in use, and is the address one of this host's?"
    )


def _host(cfg: LaunchConfig, td: timedelta) -> Any:
    sock = listen(cfg.master_addr, cfg.master_port)
    try:
        return dist.TCPStore(cfg.master_addr, cfg.master_port, None, True, td,
                             wait_for_workers=False, master_listen_fd=sock.detach())  # fmt: skip
    except TypeError:  # a torch without master_listen_fd: its own socket, on every interface
        sock.close()
        warnings.warn(
            "this torch's TCPStore cannot take a listening socket (master_listen_fd), so the "
            f"rendezvous store listens on every interface, not only on {cfg.master_addr}",
            stacklevel=3,
        )
        return dist.TCPStore(cfg.master_addr, cfg.master_port, None, True, td,
                             wait_for_workers=False)  # fmt: skip


def open_store(cfg: LaunchConfig, seconds: float) -> tuple[Any, StoreSpec]:
    td = timedelta(seconds=seconds)
    if agent_store():
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        spec = StoreSpec(cfg.master_addr, cfg.master_port, None, f"{run}/{attempt}", seconds)
    else:
        spec = StoreSpec(cfg.master_addr, cfg.master_port, 0, None, seconds)
        if cfg.rank == 0:
            return _host(cfg, td), spec
    start = time.monotonic()
    try:
        return spec.client(), spec
    except RuntimeError as exc:
        text = str(exc).strip().splitlines()
        raise CommError(
            f"rank {cfg.rank} could not reach {spec.describe()} within "
            f"{time.monotonic() - start:.0f} s (timeout {seconds:g} s): is it running, and are "
            f"MASTER_ADDR/MASTER_PORT the same on every rank? ({text[0] if text else exc})",
            ranks=(0,) if spec.host_rank == 0 else (),
            remote=True,
        ) from exc


def rendezvous(cfg: LaunchConfig, seconds: float) -> tuple[Any, StoreSpec | None]:
    """Opens the store and waits until all ranks have checked in."""
    if cfg.world_size == 1:
        return dist.HashStore(), None
    store, spec = open_store(cfg, seconds)
    store.set(f"{PREFIX}arrived/{cfg.rank}", "1")
    arrived = store.add(f"{PREFIX}arrived", 1)
    deadline = time.monotonic() + seconds
    if cfg.rank == 0:
        while arrived < cfg.world_size and time.monotonic() < deadline:
            time.sleep(0.01)
            arrived = store.add(f"{PREFIX}arrived", 0)
        if arrived >= cfg.world_size:
            store.set(f"{PREFIX}ready", "1")
            return store, spec
    else:
        try:
            left = max(0.0, deadline - time.monotonic())
            store.wait([f"{PREFIX}ready"], timedelta(seconds=left))
            return store, spec
        except RuntimeError:
            pass
    arrived = store.add(f"{PREFIX}arrived", 0)
    missing = [r for r in range(cfg.world_size) if not store.check([f"{PREFIX}arrived/{r}"])]
    shown = ", ".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
    raise CommError(
        f"megalith_comm.init on rank {cfg.rank}: only {arrived} of {cfg.world_size} ranks "
        f"arrived at the rendezvous on {cfg.master_addr}:{cfg.master_port} within {seconds:g} s "
        f"(missing rank{'s' if len(missing) != 1 else ''}: {shown}). Check that all "
        f"{cfg.world_size} processes were started with the same MASTER_ADDR/MASTER_PORT "
        f"(launcher: {cfg.source}).",
        ranks=tuple(missing),
        remote=True,
    )
