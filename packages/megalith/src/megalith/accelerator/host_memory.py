"""This process's host memory as the OS reports it: resident set, its peak, the total.

What a CPU accelerator reports as "allocated" and "reserved" memory (there is no
caching allocator on CPU to ask). Linux gives all of them through /proc; elsewhere
the peak comes from getrusage and cannot be reset, and the current resident set
is that peak (an upper bound).
"""

from __future__ import annotations

import os
import resource
import sys

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _rusage_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def rss() -> int:
    """Resident set size of this process in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return _rusage_peak()


def peak_rss() -> int:
    """The largest resident set since the process started or the last reset_peak(), bytes."""
    hwm = _status_kib("VmHWM")
    return max(hwm * 1024 if hwm is not None else _rusage_peak(), rss())


def reset_peak() -> None:
    """Starts the peak again from the current resident set (Linux: /proc/self/clear_refs).
    Where the OS cannot reset it, the peak stays the process's lifetime peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def total() -> int:
    """Physical memory of the machine in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * _PAGE
