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


#: --run_path's rank: torchrun's run_script_path (runpy.run_path of SCRIPT as __main__,
#: sys.argv = [SCRIPT, *ARGS]), here in a fresh `python -u -c` so that it starts through
#: rank_entry.py like any other rank. As under `python -c`, the working directory heads
#: sys.path.
RUN_PATH_CODE = (
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def through_rank_entry(argv: list[str], split: int) -> tuple[list[str], int]:
    """(argv, split) with each rank started as `python -S rank_entry.py PID COMMAND...`.

    COMMAND is what torchrun would have run: `python -u SCRIPT`, `python -u -m MODULE`,
    the program itself (--no_python), or for --run_path (which wins over the other two,
    as in torchrun) `python -u -c RUN_PATH_CODE SCRIPT`: torchrun would run that one in a
    multiprocessing child of the agent, which no parent-death signal, output prefix or
    stopped-rank check reaches.
    """
    head, tail = argv[:split], argv[split:]
    run_path = any(arg in _RUN_PATH for arg in head)
    module = any(arg in _MODULE for arg in head)
    program = any(arg in _NO_PYTHON for arg in head)
    head = [arg for arg in head if arg not in _MODULE + _NO_PYTHON + _RUN_PATH] + ["--no_python"]
    python = os.getenv("PYTHON_EXEC", sys.executable)  # as torchrun picks it
    if run_path:
        command = [python, "-u", "-c", RUN_PATH_CODE, *tail]
    elif program:
        command = tail
    else:
        command = [python, "-u", *(["-m"] if module else []), *tail]
    entry = [sys.executable, "-S", ENTRY, str(os.getpid()), *command]
    return head + entry, len(head)
