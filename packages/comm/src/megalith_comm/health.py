"""Finding out which rank broke a collective: heartbeats, failure reports, diagnosis.

[Note: naming the failed rank]
torch.distributed's Gloo errors name a socket ("Connection closed by peer
[127.0.0.1]:50860"), not a rank. To turn that into "rank 2 was killed", every rank
of a world larger than one:
- runs a heartbeat thread that bumps `megalith_comm/hb/<rank>` in the rendezvous
  store every HEARTBEAT_S seconds (on a store connection of its own);
- on an uncaught exception, writes `megalith_comm/failed/<rank>` = "Type: message"
  before the process exits (sys.excepthook), unless the exception was itself
  caused by another rank (CommError.remote);
- when a collective fails, `diagnose()` reads the failure reports, and if there
  are none, the heartbeats twice STALE_S apart: a rank whose counter stopped is
  dead. The verdict goes to `megalith_comm/culprit` (first writer wins) so every
  rank tells the same story. If the store itself is gone, rank 0 (its host) is.
Rank 0 hosts the store, so on its way out it closes its Gloo sockets (so that the
others fail at once instead of at the timeout) and lingers up to LINGER_S seconds
while other ranks still beat, so they can read what happened.
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from .errors import CommError

if TYPE_CHECKING:  # pragma: no cover
    from .bootstrap import World

HEARTBEAT_S = 0.5
STALE_S = 2.0
LINGER_S = 10.0
PREFIX = "megalith_comm/"


class Heartbeat:
    """A daemon thread bumping this rank's counter; stops on `stop()` or a dead store."""

    def __init__(self, world: World):
        self._stop = threading.Event()
        self._store = dist.TCPStore(
            world.master_addr, world.master_port, None, False, timedelta(seconds=world.timeout)
        )
        self._key = f"{PREFIX}hb/{world.rank}"
        self._thread = threading.Thread(
            target=self._run, name="megalith_comm-heartbeat", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._store.add(self._key, 1)
            except Exception:  # the store (rank 0) is gone: nothing left to tell
                return
            self._stop.wait(HEARTBEAT_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * HEARTBEAT_S)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _beats(store, world_size: int) -> list[int]:
    return [store.add(f"{PREFIX}hb/{r}", 0) for r in range(world_size)]


def _failures(store, world_size: int) -> dict[int, str]:
    out = {}
    for r in range(world_size):
        key = f"{PREFIX}failed/{r}"
        if store.check([key]):
            out[r] = store.get(key).decode(errors="replace")
    return out


def diagnose(world: World, what: str, exc: BaseException) -> CommError:
    """A CommError for a failed collective `what`, naming the rank(s) behind it."""
    torch_said = f"\n  torch.distributed said: {_first_line(exc)}"
    if world.world_size == 1 or world.store is None:
        return CommError(f"{what} failed on rank {world.rank}: {_first_line(exc)}")
    store = world.store
    ranks: tuple[int, ...] = ()
    try:
        store.set_timeout(timedelta(seconds=5))
        if store.check([f"{PREFIX}culprit"]):
            reason = store.get(f"{PREFIX}culprit").decode(errors="replace")
            ranks = tuple(
                int(r) for r in store.get(f"{PREFIX}culprit_ranks").decode().split(",") if r
            )
        else:
            reason, ranks = _find_culprit(store, world)
            if ranks:
                store.compare_set(f"{PREFIX}culprit_ranks", "", ",".join(map(str, ranks)))
                store.compare_set(f"{PREFIX}culprit", "", reason)
    except Exception:
        reason = (
            f"the rendezvous store on rank 0 ({world.master_addr}:{world.master_port}) is "
            "unreachable: rank 0 exited or was killed"
        )
        ranks = (0,)
    message = f"{what} failed on rank {world.rank} of {world.world_size}: {reason}{torch_said}"
    return CommError(message, ranks=ranks, remote=world.rank not in ranks)


def _find_culprit(store, world: World) -> tuple[str, tuple[int, ...]]:
    failed = _failures(store, world.world_size)
    if not failed:
        before = _beats(store, world.world_size)
        time.sleep(STALE_S)
        failed = _failures(store, world.world_size)
        after = _beats(store, world.world_size)
        if not failed:
            dead = [r for r in range(world.world_size) if after[r] == before[r] and r != world.rank]
            if dead:
                who = ", ".join(f"rank {r}" for r in dead)
                return (
                    f"{who} stopped without reporting an error (no heartbeat for {STALE_S:g} s: "
                    "killed, crashed in native code, or out of memory)",
                    tuple(dead),
                )
            return (
                "no rank reported a failure and every rank is still alive: a rank is late or "
                f"did not call this collective (timeout {world.timeout:g} s). "
                "MEGALITH_COMM_DEBUG=1 checks that all ranks call the same collectives.",
                (),
            )
    parts = [f"rank {r} failed with {msg}" for r, msg in sorted(failed.items())]
    return "; ".join(parts), tuple(sorted(failed))


def report_failure(world: World, exc: BaseException) -> None:
    """Publishes this rank's own failure for the others' diagnosis (best effort)."""
    if world.world_size == 1 or world.store is None:
        return
    if isinstance(exc, CommError) and exc.remote:
        return
    try:
        world.store.set_timeout(timedelta(seconds=2))
        world.store.set(f"{PREFIX}failed/{world.rank}", _first_line(exc))
    except Exception:
        pass


def linger_if_host(world: World) -> None:
    """On rank 0's way out: close Gloo, keep the store up while other ranks still beat."""
    if world.rank != 0 or world.world_size == 1 or world.store is None:
        return
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    deadline = time.monotonic() + LINGER_S
    try:
        last = _beats(world.store, world.world_size)
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(HEARTBEAT_S)
            now = _beats(world.store, world.world_size)
            moved = any(now[r] != last[r] for r in range(1, world.world_size))
            last = now
            if moved:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= 3 * HEARTBEAT_S:
                return
    except Exception:
        return


def install_excepthook(world: World) -> None:
    """Reports uncaught exceptions to the store (and lingers on rank 0), then the old hook."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            report_failure(world, exc)
            previous(exc_type, exc, tb)
            sys.stderr.flush()
            if world.heartbeat is not None:
                world.heartbeat.stop()
            linger_if_host(world)
        finally:
            sys.excepthook = previous

    sys.excepthook = hook
    world.restore_excepthook = lambda: setattr(sys, "excepthook", previous)
