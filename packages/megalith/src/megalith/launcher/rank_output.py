"""Each rank's console output as whole lines, each under its rank's prefix ("[rank3]:").

The elastic agent tees a rank's streams into log files and copies them to the console
with torch's tail_logfile, which writes what readline() returns: at the end of the file
that may be half a line (`python -u` writes print's text and its newline separately),
so two ranks' halves run together ("rank 0 okrank 1 ok"). whole_lines() holds a
partial line until its newline arrives (or the rank has ended), and the launcher's
stdout is made line-buffered so each line leaves at once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from threading import Event
from typing import TextIO

PREFIX_TEMPLATE = "[rank${rank}]:"


def whole_lines(
    header: str,
    file: str,
    dst: TextIO,
    finished: Event,
    interval_sec: float,
    log_line_filter: Callable[[str], bool] | None = None,
) -> None:
    """tail_logfile's contract (same arguments), writing only complete lines."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    pending = ""
    with open(file, errors="replace") as fp:
        while True:
            pending += fp.readline()
            if pending.endswith("\n"):
                if log_line_filter is None or log_line_filter(pending):
                    dst.write(header + pending)
                pending = ""
            elif finished.is_set():  # the rank has ended: what is left is its last line
                pending += fp.read()
                for line in pending.splitlines(keepends=True) if pending else ():
                    dst.write(header + line + ("" if line.endswith("\n") else "\n"))
                return
            else:
                time.sleep(interval_sec)


def install() -> None:
    """Whole, prefixed lines from here on (idempotent)."""
    from torch.distributed.elastic.multiprocessing import tail_log

    tail_log.tail_logfile = whole_lines  # TailLog.start looks the function up by this name
    os.environ.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", PREFIX_TEMPLATE)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
