"""ColossalAI's `spawn(func, nprocs, **kwargs)`: ranks that set up the process group themselves.

    def run_dist(rank, world_size, port):
        megalith.launch(rank=rank, world_size=world_size, host="localhost", port=port)
        ...

    spawn(run_dist, nprocs=2)

Unlike run_distributed, nothing is initialised before `func` runs: the function calls
megalith.launch (or launch_from_torch) with the port it is given, as ColossalAI's tests
do. The ranks are the same processes run_distributed starts (forkserver, a share of the
cores each), the failing rank's traceback fails the caller, and the run is killed after
MEGALITH_SPAWN_TIMEOUT seconds (default 300) so a hang fails rather than blocks.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from .spawn import _collect, _context, free_port, report, threads_per_rank

_DEFAULT_TIMEOUT_S = 300.0


def _timeout() -> float:
    raw = os.environ.get("MEGALITH_SPAWN_TIMEOUT", str(_DEFAULT_TIMEOUT_S))
    try:
        return float(raw)
    except ValueError:
        raise ValueError(
            f"MEGALITH_SPAWN_TIMEOUT={raw!r} is not a number of seconds; unset it or set e.g. 120"
        ) from None


def _leave_group() -> None:
    """Everyone waits for everyone (rank 0 hosts the store), then the group goes away."""
    import megalith_comm

    if megalith_comm.is_initialized():
        megalith_comm.barrier()
        megalith_comm.destroy()
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def _spawned_rank(
    rank: int, target: Callable, env: dict, threads: int | None, results: Any
) -> None:
    # The forkserver started with an older environment; the caller's is the one that counts.
    os.environ.clear()
    os.environ.update(env)
    if threads is not None:
        torch.set_num_threads(threads)

    def run() -> Any:
        value = target(rank)
        _leave_group()
        return value

    report(rank, run, results)


def spawn(func: Callable[..., Any], nprocs: int = 1, **kwargs: Any) -> None:
    """Runs func(rank, world_size=nprocs, port=<a free port>, **kwargs) on nprocs ranks.

    func must be a module-level function (it is pickled to the ranks). Returns when
    every rank has returned; the first rank to raise fails the call with its
    traceback (DistributedTestError, an AssertionError).
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"spawn: nprocs={nprocs!r}; pass the number of ranks, at least 1")
    port = free_port()
    target = functools.partial(func, world_size=nprocs, port=port, **kwargs)
    threads = None if "OMP_NUM_THREADS" in os.environ else threads_per_rank(nprocs)
    env = dict(os.environ)
    env.setdefault("MEGALITH_COMM_TIMEOUT", "60")  # a stuck collective fails inside the run
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    ctx = _context()
    results = ctx.Queue()
    procs = {
        r: ctx.Process(
            target=_spawned_rank,
            args=(r, target, env, threads, results),
            name=f"rank{r}",
            daemon=True,
        )
        for r in range(nprocs)
    }
    for p in procs.values():
        p.start()
    try:
        _collect(func, nprocs, list(procs), procs, results, _timeout())
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
        for p in procs.values():
            p.join(timeout=5)
        results.close()
