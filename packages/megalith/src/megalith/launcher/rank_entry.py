"""The first code of every rank `megalith run` starts: tie the rank to its launcher, then
become the rank's own command.

    python -S rank_entry.py LAUNCHER_PID COMMAND [ARGS...]

Run by path with -S, so it imports neither megalith nor torch nor site: it costs a few
milliseconds and works the same for scripts that never import megalith.

[Note: parent-death signal] prctl(PR_SET_PDEATHSIG, SIGKILL) asks the kernel to kill
this process when the thread that started it exits, however it exits (SIGKILL
included): the ranks die with the launcher instead of training on beside a resumed
run. The setting survives execve (except into set-user-ID programs). If the launcher
died before the prctl, the parent is no longer LAUNCHER_PID: the rank exits at once.
The agent starts its workers from its main thread, which lives as long as it does.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def tie_to_parent(launcher_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            print(f"megalith run: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}",
                  file=sys.stderr)  # fmt: skip
    if os.getppid() != launcher_pid:
        sys.exit(f"megalith run: the launcher (pid {launcher_pid}) exited before this rank started")


def main(argv: list[str]) -> None:
    if len(argv) < 3 or not argv[1].isdigit():
        sys.exit("usage: rank_entry.py LAUNCHER_PID COMMAND [ARGS...] (started by megalith run)")
    tie_to_parent(int(argv[1]))
    command = argv[2:]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.exit(f"megalith run: cannot start {command[0]}: {exc.strerror}")


if __name__ == "__main__":
    main(sys.argv)
