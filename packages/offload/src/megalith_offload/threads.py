"""Host threads for the offloaded update (OffloadConfig.cpu_threads)."""

from __future__ import annotations

import os


def host_threads(requested: int | None = None) -> int:
    """Threads for the offloaded update (see OffloadConfig.cpu_threads)."""
    if requested is not None:
        return requested
    env = os.environ.get("MEGALITH_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    per_rank = max(1, len(os.sched_getaffinity(0)) // local)
    return per_rank - 1 if per_rank > 4 else per_rank
