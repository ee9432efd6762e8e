"""A rendezvous store that refuses clients without the job's token, in front of torch's TCPStore.

torch's TCPStore has no authentication, and it accepts its connections itself, so
the check cannot sit in its accept loop. Two kernel-level checks do it instead:
- The store's listening socket (bound to the address asked for only) carries a TCP
  MD5 signature key (RFC 2385, Linux's TCP_MD5SIG) for every peer, derived from
  the job's token: the kernel drops any SYN that is not signed with it, so a client
  without the token never connects (it times out), from this host or another.
- Ranks and agents do not know the key: torch's client cannot sign. Each node's
  launcher runs a Forwarder on 127.0.0.1 that signs its upstream connection, and
  admits only local clients of its own user id (looked up in /proc/net/tcp for the
  connecting socket), closing any other at once. Ranks get MASTER_ADDR/MASTER_PORT
  of their node's forwarder. (On node 0 the forwarder has the store's port: torch
  checks that a store's own client connects to the port it listens on. With the
  store on 127.0.0.1 the forwarder takes 127.0.0.2.)

What this protects against: other users on any node and any host on the network
reading or writing the job's keys (heartbeats, NCCL ids, the rendezvous), or
joining it. What it does not: processes of the same user (they can read the
token from the launcher's memory or environment, and may connect through the
forwarder by design); an observer of the network (MD5 signs segments but does not
encrypt them, and MD5 is weak against an attacker who records traffic and has
time); kernels without TCP_MD5SIG (then guard() raises and the launcher says so).
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import threading
from contextlib import suppress

TCP_MD5SIG_EXT = 32
TCP_MD5SIG_FLAG_PREFIX = 1
MAX_KEY = 80  # TCP_MD5SIG_MAXKEYLEN


def md5_key(token: str) -> bytes:
    return hashlib.sha256(f"megalith-store:{token}".encode()).digest()


def sign(sock: socket.socket, key: bytes, peer: str | None = None) -> None:
    """Require (listener, peer None: from every peer) or add (client) TCP MD5 signatures."""
    family = sock.family
    addr = peer or ("::" if family == socket.AF_INET6 else "0.0.0.0")
    if family == socket.AF_INET6:
        packed = socket.inet_pton(socket.AF_INET6, addr)
        sockaddr = struct.pack("=H", family) + struct.pack("!HI", 0, 0) + packed + b"\0" * 4
        prefix = 128 if peer else 0
    else:
        packed = socket.inet_pton(socket.AF_INET, addr)
        sockaddr = struct.pack("=H", family) + struct.pack("!H", 0) + packed
        prefix = 32 if peer else 0
    option = sockaddr.ljust(128, b"\0")
    option += struct.pack("=BBHi", TCP_MD5SIG_FLAG_PREFIX, prefix, len(key), 0)
    option += key[:MAX_KEY].ljust(MAX_KEY, b"\0")
    sock.setsockopt(socket.IPPROTO_TCP, TCP_MD5SIG_EXT, option)


def signatures_supported() -> bool:
    """Whether this kernel takes TCP MD5 signature keys (Linux with TCP_MD5SIG)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sign(sock, md5_key("probe"))
        return True
    except (OSError, AttributeError):
        return False


def guarded_listener(addr: str, port: int, key: bytes) -> socket.socket:
    """A listening socket on addr:port only that admits signed connections only."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sign(sock, key)
        sock.bind(sockaddr)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _proc_net_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid owning the socket local -> remote on this host (/proc/net/tcp{,6})."""

    def hexaddr(addr: str, six: bool) -> str:
        if six:  # an IPv4 peer of a dual-stack socket appears as ::ffff:a.b.c.d
            packed = socket.inet_pton(socket.AF_INET6, addr if ":" in addr else "::ffff:" + addr)
            return "".join(f"{w:08X}" for w in struct.unpack("=4I", packed))
        return f"{struct.unpack('=I', socket.inet_aton(addr))[0]:08X}"

    for name, six in (("tcp", False), ("tcp6", True)):
        try:
            with open(f"/proc/net/{name}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        try:
            want = (
                f"{hexaddr(local[0], six)}:{local[1]:04X}",
                f"{hexaddr(remote[0], six)}:{remote[1]:04X}",
            )
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 7 and (cols[1], cols[2]) == want:
                return int(cols[7])
    return None


class Forwarder:
    """addr:port (a loopback address; port 0: any) -> the guarded store, for local clients
    of this user id."""

    def __init__(self, upstream: tuple[str, int], key: bytes, addr: str = "127.0.0.1",
                 port: int = 0):  # fmt: skip
        self.upstream, self._key = upstream, key
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((addr, port))
        self._listener.listen(2048)
        self.addr, self.port = self._listener.getsockname()[:2]
        self.refused = 0
        self._closed = False
        threading.Thread(target=self._accept, name="megalith-store-forwarder", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, peer = self._listener.accept()
            except OSError:
                return
            if _proc_net_uid(peer[:2], (self.addr, self.port)) != os.getuid():
                self.refused += 1
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        family = socket.getaddrinfo(*self.upstream, type=socket.SOCK_STREAM)[0]
        upstream = socket.socket(family[0], socket.SOCK_STREAM)
        try:
            sign(upstream, self._key, family[4][0])
            upstream.connect(family[4])
        except OSError:
            upstream.close()
            client.close()
            return
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()

    def close(self) -> None:
        self._closed = True
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    with suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
