"""The launcher's rendezvous: torch's static rendezvous, on a store that checks the job's token.

torchrun's static rendezvous has node 0's agent host a TCPStore that listens on
every interface and lets any client in. `megalith run` swaps in the "megalith"
rendezvous backend instead (same protocol for agents and ranks), whose store is
megalith_comm.store_guard's: bound to --master_addr only (127.0.0.1 unless given;
with --hostfile/--host, the address of node 0 that the other nodes reach), and
admitting only connections signed with a key derived from a per-job token. Every
node's agent and ranks reach it through their node's forwarder (a loopback address,
this user only), so ranks get its MASTER_ADDR and MASTER_PORT; the token
stays in the launchers: a random one per job, handed to the other nodes' launchers
on their standard input (never on a command line).
A --rdzv_backend other than static (c10d, etcd) or --standalone keeps torch's own
store, unguarded.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from datetime import timedelta

from megalith.launcher.torchrun_argv import option_value
from megalith_comm.store_guard import (
    Forwarder,
    guarded_listener,
    md5_key,
    signatures_supported,
)

BACKEND = "megalith"
TOKEN_ENV = "MEGALITH_STORE_TOKEN"
_forwarders: list[Forwarder] = []
_token = {"value": ""}  # this job's, set by guarded_argv (kept out of torch's logged config)


def job_token() -> str:
    """This job's token: the one node 0's launcher handed over, else a new one."""
    return os.environ.get(TOKEN_ENV) or secrets.token_hex(16)


def free_port(addr: str) -> int:
    with socket.socket(socket.getaddrinfo(addr, 0)[0][0]) as sock:
        sock.bind((addr, 0))
        return sock.getsockname()[1]


def _create(params):
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    class GuardedRendezvous(StaticTCPRendezvous):
        def get_backend(self) -> str:
            return BACKEND

    addr, port = parse_rendezvous_endpoint(params.endpoint, -1)
    rank = int(params.config["rank"])
    timeout = int(params.config.get("timeout", 600))
    key = md5_key(_token["value"])
    if rank == 0:  # torch wants the store's own client on the store's port (store_guard)
        local = "127.0.0.2" if socket.gethostbyname(addr) == "127.0.0.1" else "127.0.0.1"
        forwarder = Forwarder((addr, port), key, local, port)
    else:
        forwarder = Forwarder((addr, port), key)
    _forwarders.append(forwarder)
    handler = GuardedRendezvous(forwarder.addr, forwarder.port, rank, params.max_nodes,
                                params.run_id, timeout)  # fmt: skip
    if rank == 0:  # the store itself; its own client goes through the forwarder too
        listener = guarded_listener(addr, port, key)
        if params.max_nodes > 1:
            print(f"megalith run: the rendezvous store listens on {addr}:{port} only (the "
                  "--master_addr the other nodes reach node 0 by), for clients with this "
                  "job's token", file=sys.stderr, flush=True)  # fmt: skip
        handler._store = TCPStore(forwarder.addr, forwarder.port, None, True,
                                  timedelta(seconds=timeout), wait_for_workers=False,
                                  multi_tenant=True, master_listen_fd=listener.detach())  # fmt: skip
    return handler


def register() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create)


def close_forwarders() -> None:
    while _forwarders:
        _forwarders.pop().close()


_DROP = {"--master_addr", "--master-addr", "--master_port", "--master-port", "--rdzv_backend",
         "--rdzv-backend", "--rdzv_endpoint", "--rdzv-endpoint", "--node_rank", "--node-rank"}  # fmt: skip


def guarded_argv(argv: list[str], split: int, token: str) -> tuple[list[str], int, str]:
    """(argv, split, where) with the megalith backend in place of static; argv unchanged
    (where "") when the user chose another backend or --standalone."""
    head, tail = argv[:split], argv[split:]
    backend = option_value(head, "--rdzv_backend", "--rdzv-backend") or "static"
    if (
        backend != "static"
        or "--standalone" in head
        or option_value(head, "--rdzv_conf", "--rdzv-conf")
    ):
        return argv, split, ""
    if not signatures_supported():
        print("megalith run: warning: this kernel has no TCP MD5 signatures (TCP_MD5SIG), so "
              "the rendezvous store is torch's own, open to any client that reaches it; "
              "run on a Linux kernel with TCP_MD5SIG or keep the job on a trusted network",
              file=sys.stderr, flush=True)  # fmt: skip
        return argv, split, ""
    addr = option_value(head, "--master_addr", "--master-addr") or "127.0.0.1"
    port = option_value(head, "--master_port", "--master-port") or str(free_port(addr))
    rank = option_value(head, "--node_rank", "--node-rank") or "0"
    kept, skip = [], False
    for arg in head:
        if skip:
            skip = False
        elif arg in _DROP:
            skip = True
        elif arg.split("=", 1)[0] not in _DROP:
            kept.append(arg)
    kept += ["--rdzv_backend", BACKEND, "--rdzv_endpoint", f"{addr}:{port}"]
    kept += ["--rdzv_conf", f"rank={rank}"]
    _token["value"] = token
    return kept + tail, len(kept), f"{addr}:{port}"
