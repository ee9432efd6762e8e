"""Finding out which rank broke a collective: failure reports and diagnosis.

[Note: naming the failed rank]
torch.distributed's Gloo errors name a socket ("Connection closed by peer
[127.0.0.1]:50860"), not a rank. To turn that into "rank 2 was killed", every rank
of a world larger than one:
- beats a heart in the rendezvous store and publishes how many collectives it has
  issued on each group (watchdog.Heartbeat);
- on an uncaught exception, writes `megalith_comm/failed/<rank>` = "Type: message"
  (and sets `failed_any`) before the process exits (sys.excepthook), unless the
  exception was itself caused by another rank (CommError.remote);
- when a collective fails, `diagnose()` reads the failure reports; if there are
  none, the heartbeats twice STALE_S apart: a rank whose counter stopped is dead;
  a rank that stopped beating on this host is looked up by the pid it published
  (`pid/<rank>`), to tell one stopped by SIGSTOP or a debugger from a dead one;
  if all are alive, a rank of the group that has issued fewer collectives on it is
  stuck before this one (or skipped it). The verdict goes to
  `megalith_comm/culprit` (first writer wins) so that every rank tells the same
  story. If the store itself is gone, rank 0 (its host) is.
When rank 0 hosts the store, on its way out it lingers up to LINGER_S seconds while
other ranks still beat, so that they can read what happened (see [Note: the
watchdog] for how ranks blocked on it get out).
"""

from __future__ import annotations

import socket
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .errors import CommError
from .store import PREFIX
from .watchdog import HEARTBEAT_S

if TYPE_CHECKING:  # pragma: no cover
    from .bootstrap import World

STALE_S = 2.0
LINGER_S = 10.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _beats(store, world_size: int) -> list[int]:
    return [store.add(f"{PREFIX}hb/{r}", 0) for r in range(world_size)]


def failures(store, world_size: int) -> dict[int, str]:
    out = {}
    for r in range(world_size):
        key = f"{PREFIX}failed/{r}"
        if store.check([key]):
            out[r] = store.get(key).decode(errors="replace")
    return out


def _progress(store, rank: int, group_name: str) -> int | None:
    key = f"{PREFIX}progress/{rank}"
    if not store.check([key]):
        return None
    for item in store.get(key).decode().split(","):
        name, _, count = item.rpartition("=")
        if name == group_name:
            return int(count)
    return None


def _stopped(store, rank: int) -> str:
    """ "rank R (pid P) is stopped ..." when a rank on this host that stopped beating is
    stopped by a signal or a debugger ("" otherwise, or when it runs elsewhere)."""
    key = f"{PREFIX}pid/{rank}"
    if not store.check([key]):
        return ""
    host, _, pid = store.get(key).decode(errors="replace").partition(" ")
    if host != socket.gethostname() or not pid.isdigit():
        return ""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""
    return f"rank {rank} (pid {pid}) is stopped (SIGSTOP or a debugger)" if state in "Tt" else ""


def _after(world: World, exc: BaseException) -> str:
    """ " after N s (the collective timeout)" when torch's error is a timeout."""
    if "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower():
        return f" after {world.timeout:g} s (the collective timeout)"
    return ""


def diagnose(world: World, what: str, exc: BaseException, group: Any = None) -> CommError:
    """A CommError for a failed collective `what` (on `group`), naming the rank(s) behind it."""
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
            reason, ranks = _find_culprit(store, world, group)
            if ranks:
                store.compare_set(f"{PREFIX}culprit_ranks", "", ",".join(map(str, ranks)))
                store.compare_set(f"{PREFIX}culprit", "", reason)
        store.set(f"{PREFIX}diagnosed/{world.rank}", "1")  # rank 0 need not linger for us
        store.set_timeout(timedelta(seconds=world.timeout))
    except Exception:
        spec = world.store_spec
        if spec is not None and spec.host_rank == 0:
            reason = f"{spec.describe()} is unreachable: rank 0 exited or was killed"
            ranks = (0,)
        else:
            reason = "the rendezvous store is unreachable (the launcher's agent is gone?)"

    if getattr(group, "name", None) and "group" not in what:
        what = f"{what} on group {group.name!r}"
    message = (
        f"{what} failed on rank {world.rank} of {world.world_size}{_after(world, exc)}: "
        f"{reason}{torch_said}"
    )
    return CommError(message, ranks=ranks, remote=world.rank not in ranks)


def _find_culprit(store, world: World, group: Any) -> tuple[str, tuple[int, ...]]:
    failed = failures(store, world.world_size)
    if not failed:
        before = _beats(store, world.world_size)
        time.sleep(STALE_S)
        if store.check([f"{PREFIX}culprit"]):  # another rank got there first
            return store.get(f"{PREFIX}culprit").decode(errors="replace"), tuple(
                int(r) for r in store.get(f"{PREFIX}culprit_ranks").decode().split(",") if r
            )
        failed = failures(store, world.world_size)
        after = _beats(store, world.world_size)
        if not failed:
            dead = [r for r in range(world.world_size) if after[r] == before[r] and r != world.rank]
            if dead:
                known = [_stopped(store, r) for r in dead]
                if all(known):
                    return f"{'; '.join(known)}: no heartbeat for {STALE_S:g} s", tuple(dead)
                who = ", ".join(f"rank {r}" for r in dead)
                return (
                    f"{who} stopped without reporting an error (no heartbeat for {STALE_S:g} s: "
                    "killed, stopped, crashed in native code, or out of memory)",
                    tuple(dead),
                )
            late = _late(store, world, group)
            if late:
                return late
            return (
                "no rank reported a failure and every rank is still alive: a rank is late or "
                f"did not call this collective (timeout {world.timeout:g} s). "
                "MEGALITH_COMM_DEBUG=1 checks that all ranks call the same collectives.",
                (),
            )
    parts = [f"rank {r} failed with {msg}" for r, msg in sorted(failed.items())]
    return "; ".join(parts), tuple(sorted(failed))


def _late(store, world: World, group: Any) -> tuple[str, tuple[int, ...]] | None:
    """Ranks of the group that have issued fewer collectives on it than this rank."""
    if group is None:
        return None
    counts = {r: _progress(store, r, group.name) for r in group.ranks if r != world.rank}
    behind = {r: c for r, c in counts.items() if c is not None and c < group.issued}
    if not behind:
        return None
    parts = [f"rank {r} has issued {c}" for r, c in sorted(behind.items())]
    return (
        f"{', '.join(parts)} collective(s) on group {group.name!r}, this rank {group.issued}: "
        f"{'they are' if len(behind) > 1 else 'it is'} stuck before this collective (busy, "
        "blocked, or skipped it); all ranks are alive",
        tuple(sorted(behind)),
    )


def report_failure(world: World, exc: BaseException) -> None:
    """Publishes this rank's own failure for the others' diagnosis (best effort)."""
    if world.world_size == 1 or world.store is None:
        return
    if isinstance(exc, CommError) and exc.remote:
        return
    try:
        world.store.set_timeout(timedelta(seconds=2))
        world.store.set(f"{PREFIX}failed/{world.rank}", _first_line(exc))
        world.store.set(f"{PREFIX}failed_any", "1")
    except Exception:
        pass


def linger_if_host(world: World) -> None:
    """On rank 0's way out: keep the store up (at most LINGER_S) until every other rank has
    failed, diagnosed the failure, been named as the culprit, or stopped beating."""
    spec = world.store_spec
    if world.rank != 0 or spec is None or spec.host_rank != 0 or world.store is None:
        return
    store, others = world.store, range(1, world.world_size)
    deadline = time.monotonic() + LINGER_S
    try:
        last = _beats(store, world.world_size)
        still = {r: time.monotonic() for r in others}  # when each rank's heartbeat last moved
        while time.monotonic() < deadline:
            culprits = set()
            if store.check([f"{PREFIX}culprit_ranks"]):
                culprits = {
                    int(r) for r in store.get(f"{PREFIX}culprit_ranks").decode().split(",") if r
                }
            now = _beats(store, world.world_size)
            waiting = []
            for r in others:
                if now[r] != last[r]:
                    still[r] = time.monotonic()
                done = (
                    r in culprits
                    or time.monotonic() - still[r] >= 3 * HEARTBEAT_S
                    or store.check([f"{PREFIX}failed/{r}"])
                    or store.check([f"{PREFIX}diagnosed/{r}"])
                )
                if not done:
                    waiting.append(r)
            if not waiting:
                return
            last = now
            time.sleep(HEARTBEAT_S)
    except Exception:
        return


def install_excepthook(world: World) -> None:
    """Reports uncaught exceptions to the store (and lingers on rank 0), then the old hook."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        world.failed = True
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
