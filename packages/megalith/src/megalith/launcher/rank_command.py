"""The torchrun argv that starts each rank through rank_entry.py (see [Note: parent-death
signal] there) instead of the bare script, module or program."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENTRY = str(Path(__file__).with_name("rank_entry.py"))
_MODULE = ("--module", "-m")
_NO_PYTHON = ("--no_python", "--no-python")
_RUN_PATH = ("--run_path", "--run-path")


def through_rank_entry(argv: list[str], split: int) -> tuple[list[str], int]:
    """(argv, split) with each rank started as `python -S rank_entry.py PID COMMAND...`.

    COMMAND is what torchrun would have run: `python -u SCRIPT`, `python -u -m MODULE`
    or the program itself (--no_python). --run_path ranks run inside a multiprocessing
    child of the agent, not a command: they are left as they are (the heartbeat's check
    for a vanished store still ends them when they use megalith_comm).
    """
    head, tail = argv[:split], argv[split:]
    if any(arg in _RUN_PATH for arg in head):
        return argv, split
    module = any(arg in _MODULE for arg in head)
    program = any(arg in _NO_PYTHON for arg in head)
    head = [arg for arg in head if arg not in _MODULE + _NO_PYTHON] + ["--no_python"]
    if program:
        command = tail
    else:
        python = os.getenv("PYTHON_EXEC", sys.executable)  # as torchrun picks it
        command = [python, "-u", *(["-m"] if module else []), *tail]
    entry = [sys.executable, "-S", ENTRY, str(os.getpid()), *command]
    return head + entry, len(head)
