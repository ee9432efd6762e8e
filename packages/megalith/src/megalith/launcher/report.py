"""Which rank failed first, and the lines `megalith run` ends with.

The elastic agent returns one ProcessFailure per failed rank (ChildFailedError.
failures). Without torch's @record in the user's script there is no error file,
so the error text comes from the rank's stderr log (the launcher tees stderr
into a log dir) and the failure time is only the agent's poll time, in whole
seconds. [Note: first failure] Ranks that died because another did are ranked
after those that did not:
1. exit by SIGTERM: the agent stops the survivors with SIGTERM once one fails;
2. a stderr tail saying a peer went away (a closed connection, an aborted
   communicator, a timeout): the rank was waiting on the one that died;
then by the agent's timestamp (capture order), then by the last write to the
rank's stderr (a rank that printed its error and exited wrote before the
survivors printed theirs). That last key counts only for ranks that exited
with a code of their own and wrote something: the log of a rank killed by a
signal says nothing about when it died, so such a rank comes after them.

[Note: megalith's diagnosis] A rank that megalith_comm ends prints a CommError
naming the rank behind the failure, the collective and its group. A line with
"CommError" in a rank's stderr is that rank's error, even when more lines
follow it; and when the first failure left no words of its own (killed by a
signal, or stopped and killed by the launcher: `hung`), the headline adds what
a peer's CommError says about it, so megalith's diagnosis is the last line.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "megalith run:"
# A node started over ssh prints its failures on one stderr line after this
# marker; the launcher on node 0 reads it instead of showing it.
MARKER = "MEGALITH_RUN_FAILURES "
TAIL_LINES = 8
MAX_ERROR = 400  # characters of the error quoted in the headline
PEER_LOSS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "distnetworkerror",
    "distbackenderror",
    "communicator was aborted",
    "socket timeout",
    "timed out",
)
_NO_TRACEBACK = "To enable traceback see"
_COMM_ERROR = re.compile(r"\bCommError(?: \(watchdog\))?: (?P<text>.*)")
# "<op> on group 'g' failed on rank R of N[ after S s (...)]: <why>" (megalith_comm.health)
_COMM_PARTS = re.compile(
    r"(?P<what>.+?) failed on rank (?P<rank>\d+) of \d+(?: after (?P<secs>[\d.]+) s[^:]*)?: "
    r"(?P<why>.*)"
)
HUNG = "stopped (SIGSTOP or a debugger) when the job was stopped, so the launcher killed it"


@dataclass
class Failure:
    rank: int
    local_rank: int
    pid: int
    exitcode: int
    host: str = ""
    message: str = ""  # from the rank's error file (torch's @record), if it wrote one
    tail: list[str] = field(default_factory=list)  # last lines of its stderr
    stderr_path: str = ""
    timestamp: float = 0.0  # when the agent saw it fail (seconds)
    mtime: float = float("inf")  # last write to its stderr log
    hung: bool = False  # stopped when the job was stopped; killed by the launcher

    def comm_error(self) -> str:
        """Its megalith_comm CommError, if its stderr has one (the last)."""
        for line in reversed([*self.tail, *self.message.splitlines()]):
            found = _COMM_ERROR.search(line)
            if found:
                return "CommError: " + found["text"].strip()
        return ""

    def error(self) -> str:
        """One line: the rank's own words if it left any, else how it died."""
        if self.hung:
            return HUNG
        lines = [line for line in self.message.splitlines() if line.strip()]
        lines = lines or [line for line in self.tail if line.strip()]
        if lines:  # without the "[rank0]:" that torch puts before its own tracebacks
            line = self.comm_error() or re.sub(r"^(\[rank\d+\]:\s*)+", "", lines[-1].strip())
            return line if len(line) <= MAX_ERROR else line[: MAX_ERROR - 3] + "..."
        if self.exitcode < 0:
            return f"killed by signal {signal_name(-self.exitcode)}"
        return "no error output (stderr was empty)"

    def stopped_by_agent(self) -> bool:
        return self.exitcode == -signal.SIGTERM

    def lost_peer(self) -> bool:
        text = "\n".join([self.message, *self.tail]).lower()
        return any(pattern in text for pattern in PEER_LOSS) or bool(self.blamed())

    def blamed(self) -> set[int]:
        """The other ranks its CommError names as the cause."""
        parts = _COMM_PARTS.match(self.comm_error().removeprefix("CommError: "))
        named = {int(r) for r in re.findall(r"\brank (\d+)\b", parts["why"])} if parts else set()
        return named - {self.rank}

    def sort_key(self) -> tuple:
        return (self.stopped_by_agent(), self.lost_peer(), int(self.timestamp), self.mtime)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def read_tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as file:
            file.seek(0, 2)
            file.seek(max(0, file.tell() - 16384))
            text = file.read().decode(errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines()[-lines:]]


def _error_file_message(pf: Any) -> str:
    """The message of the rank's error file, when it wrote one (torch's @record)."""
    if not os.path.isfile(str(pf.error_file)):
        return ""
    data = pf.error_file_data
    message = data.get("message", "") if isinstance(data, dict) else ""
    if isinstance(message, dict):
        message = message.get("message", "")
    return "" if _NO_TRACEBACK in str(message) else str(message)


def from_child_failed(
    exc: Any, run_dir: Path | None, host: str = "", hung_pids: set[int] | frozenset = frozenset()
) -> list[Failure]:
    """Failures of a ChildFailedError, with the stderr tails found under the agent's run_dir;
    hung_pids: the ranks the launcher killed because they were stopped (stopped_ranks)."""
    failures = []
    for rank, pf in exc.failures.items():
        stderr = stderr_log(run_dir, pf.local_rank) if run_dir else None
        mtime = float("inf")
        if stderr and stderr.exists() and stderr.stat().st_size and pf.exitcode > 0:
            mtime = stderr.stat().st_mtime  # see [Note: first failure]
        failures.append(
            Failure(
                rank=int(rank),
                local_rank=int(pf.local_rank),
                pid=int(pf.pid),
                exitcode=int(pf.exitcode),
                host=host,
                message=_error_file_message(pf),
                tail=read_tail(stderr) if stderr else [],
                stderr_path=str(stderr or ""),
                timestamp=float(pf.timestamp),
                mtime=mtime,
                hung=int(pf.pid) in hung_pids,
            )
        )
    return failures


def stderr_log(run_dir: Path, local_rank: int) -> Path | None:
    """<run_dir>/attempt_<n>/<local_rank>/stderr.log of the last attempt (the agent's layout)."""
    found = sorted(
        run_dir.glob(f"attempt_*/{local_rank}/stderr.log"),
        key=lambda p: int(p.parent.parent.name.rpartition("_")[2]),
    )
    return found[-1] if found else None


def first_failure(failures: list[Failure]) -> Failure:
    return min(failures, key=Failure.sort_key)


def exit_code(failure: Failure) -> int:
    """The launcher's own exit status: the rank's code, 128+N for signal N."""
    if 0 < failure.exitcode < 256:
        return failure.exitcode
    return 128 + -failure.exitcode if failure.exitcode < 0 else 1


def _where(f: Failure) -> str:
    host = f", host {f.host}" if f.host else ""
    return f"local_rank {f.local_rank}, pid {f.pid}{host}"


def summary(failures: list[Failure]) -> list[str]:
    """The closing lines: the first failure's stderr tail, the others, then the headline."""
    first = first_failure(failures)
    lines = []
    if first.tail:
        where = f" on {first.host}" if first.host else ""
        where += f" ({first.stderr_path})" if first.stderr_path else ""
        lines.append(f"{PREFIX} last lines of rank {first.rank}'s stderr{where}:")
        lines.extend(f"    {line}" for line in first.tail)
    others = sorted((f for f in failures if f is not first), key=lambda f: f.rank)
    for f in others:
        cause = f.error()
        if f.stopped_by_agent():
            cause = "stopped by the launcher" + (f"; its last line: {cause}" if f.tail else "")
        lines.append(f"{PREFIX} then rank {f.rank} ({_where(f)}) exit code {f.exitcode}: {cause}")
    how = "exit code" if first.exitcode >= 0 else "exit code (signal)"
    verb = "hung and failed first" if first.hung else "failed first"
    lines.append(
        f"{PREFIX} rank {first.rank} ({_where(first)}) {verb}, {how} {first.exitcode}: "
        f"{first.error()}{_peer_view(first, failures)}"
    )
    return lines


def _peer_view(first: Failure, failures: list[Failure]) -> str:
    """What a peer's CommError says about `first`, when it left no words of its own (see
    [Note: megalith's diagnosis]): "; rank 0 waited 3 s for it in <op>: <why>"."""
    if not (first.hung or first.exitcode < 0) or first.comm_error():
        return ""
    peers = [f for f in failures if f is not first and f.comm_error()]
    peers.sort(key=lambda f: (first.rank not in f.blamed(), f.rank))
    if not peers:
        return ""
    peer = peers[0]
    parts = _COMM_PARTS.match(peer.comm_error().removeprefix("CommError: "))
    if parts is None or first.rank not in peer.blamed():
        return f"; rank {peer.rank} reports {peer.comm_error()}"
    waited = f" {float(parts['secs']):g} s" if parts["secs"] else ""
    return f"; rank {peer.rank} waited{waited} for it in {parts['what']}: {parts['why']}"


def encode(failures: list[Failure]) -> str:
    return MARKER + json.dumps([asdict(f) for f in failures], default=str)


def decode(line: str, host: str) -> list[Failure] | None:
    """Failures from a MARKER line of a remote node (None: not such a line)."""
    if not line.startswith(MARKER):
        return None
    try:
        items = json.loads(line[len(MARKER) :])
        failures = [Failure(**item) for item in items]
    except (ValueError, TypeError):
        return None
    for f in failures:
        f.host = f.host or host
    return failures
