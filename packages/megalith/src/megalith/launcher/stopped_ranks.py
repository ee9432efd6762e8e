"""Ranks that cannot stop when the launcher stops the job, because they are stopped.

When one rank fails, the elastic agent sends the others SIGTERM and waits up to its
shutdown timeout (30 s) before SIGKILL. A rank stopped by SIGSTOP (or held by a
debugger) keeps the SIGTERM pending and cannot act on it, so the job lingered 30 s
and the summary blamed "killed by signal SIGKILL", the agent's own kill. This thread
watches the launcher's children: one that is stopped with SIGTERM pending is killed
at once and remembered, so the summary can say that it hung. A stopped rank that
nobody asked to end is left alone.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

POLL_S = 0.2
STOPPED_STATES = ("T", "t")  # stopped, tracing stop


def children(pid: int) -> list[int]:
    """The child processes of pid (from /proc; empty where there is no /proc)."""
    found = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(word) for word in path.read_text().split()]
        except OSError:
            continue
    return found


def stopped_with_pending(pid: int, signum: int = signal.SIGTERM) -> bool:
    """Whether pid is stopped while signum waits for it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if fields.get("State", "").strip()[:1] not in STOPPED_STATES:
        return False
    bit = 1 << (signum - 1)
    return any(int(fields.get(key, "0").strip(), 16) & bit for key in ("SigPnd", "ShdPnd"))


class StoppedRankReaper:
    """While running: SIGKILL to each child stopped with a SIGTERM pending; `killed` holds their pids."""

    def __init__(self, interval: float = POLL_S):
        self.interval = interval
        self.killed: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="megalith-run-stopped", daemon=True)

    def __enter__(self) -> StoppedRankReaper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(self.interval):
            for pid in children(me):
                if pid not in self.killed and stopped_with_pending(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.killed.add(pid)
                    except OSError:
                        pass
