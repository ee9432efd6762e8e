"""The per-rank background thread: heartbeat, progress, and exit when a peer failed.

[Note: the watchdog]
A Gloo collective blocked on a peer that raised but whose process is still alive
(rank 0 keeps running a little after its failure, because it hosts the store
everyone reads the failure from) does not fail until the collective timeout:
aborting a Gloo process group does not wake a waiting thread. So the thread that
beats the heart also watches: when a failure report appears in the store
(`megalith_comm/failed_any`) while this rank's main thread has been blocked in a
collective for WATCHDOG_GRACE_S, it prints what happened, naming the failed rank,
and ends the process with exit code 1, as torch's NCCL watchdog does. A rank that
is not blocked meets the failure at its next collective the normal way.

[Note: the launcher's store is gone] Under `megalith run` (and torchrun) the store
lives in the launcher's agent, which outlives every rank of a job that ends
normally. So when the heartbeat loses it, and a fresh connection is refused too,
the launcher is gone (killed, or its node lost): the rank says so and exits with
code 1 instead of training on unsupervised. This backs up the parent-death signal
(launcher/rank_entry.py) for ranks on other nodes and for --run_path ranks.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

from .store import PREFIX

if TYPE_CHECKING:  # pragma: no cover
    from .bootstrap import World

HEARTBEAT_S = 0.5
WATCHDOG_GRACE_S = 1.0
#: the longest one of the heartbeat's store calls may block (its connection's timeout).
#: stop() waits that long for the thread: a daemon thread still inside a store call when
#: the interpreter finalizes is ended as the call returns, inside C++ code that cannot
#: unwind, and the process aborts ("terminate called without an active exception").
STORE_CALL_S = 5.0
#: how long the check that the launcher's store is really gone waits for a connection
STORE_CHECK_S = 2.0


def whoami() -> str:
    """This process as `pid/<rank>` holds it: "<host> <pid>" (see health._state)."""
    return f"{socket.gethostname()} {os.getpid()}"


class Heartbeat:
    """A thread that bumps `hb/<rank>`, publishes `progress/<rank>` and watches for
    failures while the main thread runs."""

    def __init__(self, world: World):
        self._world = world
        self._stop = threading.Event()
        # A connection of its own: the main thread may be using world.store.
        self._store = world.store_spec.client(timeout=STORE_CALL_S)
        self._store.set(f"{PREFIX}pid/{world.rank}", whoami())
        # Not a daemon: it ends by itself once the main thread has (see _run), and the
        # interpreter waits for that before it finalizes (STORE_CALL_S).
        self._thread = threading.Thread(target=self._run, name="megalith_comm-heartbeat")
        self._thread.start()

    def _run(self) -> None:
        rank = self._world.rank
        published = None
        main = threading.main_thread()
        while not self._stop.is_set() and main.is_alive():
            try:
                self._store.add(f"{PREFIX}hb/{rank}", 1)
                try:  # the main thread may be adding a group right now
                    groups = list(self._world.groups.items())
                except RuntimeError:
                    groups = None
                progress = ",".join(f"{name}={g.issued}" for name, g in groups or ())
                if groups is not None and progress != published:
                    self._store.set(f"{PREFIX}progress/{rank}", progress)
                    published = progress
                if self._store.check([f"{PREFIX}failed_any"]):
                    self._watch()
            except Exception:  # the store is gone (rank 0, or the launcher: see the Note)
                if not self._reconnect():
                    return
            self._stop.wait(HEARTBEAT_S)

    def _reconnect(self) -> bool:
        """After a failed store call: True with a fresh connection; False when the store
        is rank 0's (nothing left to tell); the process ends when the launcher's is gone."""
        spec = self._world.store_spec
        if spec.host_rank is not None or self._stop.is_set():
            return False
        try:  # a bare connect: refused at once when nobody listens (TCPStore would retry)
            socket.create_connection((spec.addr, spec.port), timeout=STORE_CHECK_S).close()
            self._store = spec.client(timeout=STORE_CALL_S)
            return True
        except Exception as exc:
            if self._stop.is_set() or not threading.main_thread().is_alive():
                return False
            print(
                f"megalith_comm: rank {self._world.rank} lost {spec.describe()} ({exc}): the "
                "launcher exited or was killed; exiting with code 1 so that no rank trains on "
                "without it.",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)

    def _watch(self) -> None:
        blocked = self._world.blocked
        if blocked is None or time.monotonic() - blocked[1] < WATCHDOG_GRACE_S:
            return
        from .health import failures

        failed = failures(self._store, self._world.world_size)
        if not failed or set(failed) == {self._world.rank}:
            return
        who = "; ".join(f"rank {r} failed with {msg}" for r, msg in sorted(failed.items()))
        print(
            f"megalith_comm CommError (watchdog): {blocked[0]} failed on rank "
            f"{self._world.rank} of {self._world.world_size}: {who}. This rank was blocked in it "
            f"for {time.monotonic() - blocked[1]:.1f} s; exiting with code 1.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=STORE_CALL_S + 2 * HEARTBEAT_S)
