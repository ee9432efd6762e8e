"""run_distributed: run a function on N fresh ranks, get back every rank's result.

Each rank is a process of the spawn start method with torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>) that
calls megalith_comm.init() and then fn(rank, *args). The parent collects return
values (pickled). The first rank to raise fails the run with its rank, exception
and traceback, and the other ranks are killed; so does a rank that dies without a
word; and when `timeout` passes every rank is killed and the run fails naming the
ranks that had not finished. A hang fails; it never blocks CI.

Ranks are forked from a server process that has imported torch once (the
forkserver start method with torch preloaded), so a rank starts in milliseconds
instead of the seconds an import of torch costs, and still starts clean: nothing
of the test process is inherited. MEGALITH_TEST_START_METHOD=spawn restores fresh
interpreters. Still, put many checks in one run: run_grid(fn, settings, world_size)
calls fn(rank, setting) for every setting in one process group.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.multiprocessing as mp

# How long a rank that exited gets for its last message to arrive.
_EXIT_GRACE_S = 2.0
# How long an error caused by another rank waits for that rank's own error (or death).
_REMOTE_WAIT_S = 4.0


class DistributedTestError(AssertionError):
    """A rank failed, died, or the run timed out. `rank` is the failed rank (None: timeout)."""

    def __init__(self, message: str, rank: int | None = None, exc_type: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def threads_per_rank(ranks: int) -> int:
    """The cores this process may use, shared among `ranks` processes (at least one each).

    As torchrun does (OMP_NUM_THREADS=1 per rank), ranks must not each take every core:
    on a small machine, ranks x cores spinning OpenMP threads make a Gloo step several
    times slower (a 4-rank ZeRO test: 120 s against 41 s on 2 cores).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, ranks))


def _context() -> Any:
    """forkserver with torch preloaded where the platform has it, else spawn.

    MEGALITH_TEST_PRELOAD (comma-separated modules, default "torch") names what the
    server imports once; a module that is not installed is skipped.
    """
    method = os.environ.get("MEGALITH_TEST_START_METHOD", "forkserver")
    if method not in mp.get_all_start_methods():
        method = "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":  # read when the server starts; later calls change nothing
        preload = os.environ.get("MEGALITH_TEST_PRELOAD", "torch")
        ctx.set_forkserver_preload([m.strip() for m in preload.split(",") if m.strip()])
    return ctx


def gpus_for(world_size: int) -> bool:
    """True when there is one CUDA GPU per rank."""
    return torch.cuda.is_available() and torch.cuda.device_count() >= world_size


def _skip(reason: str) -> None:
    try:
        import pytest
    except ImportError:  # pragma: no cover
        raise RuntimeError(reason) from None
    pytest.skip(reason)


def _child(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable,
    args: tuple,
    env: Mapping,
    device: str,
    results: Any,
) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    os.environ.update(env)
    if "OMP_NUM_THREADS" in env:  # torch read the variable at import, before this update
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    import megalith_comm

    def run() -> Any:
        megalith_comm.init(device=device if device == "cpu" else f"cuda:{rank}")
        value = fn(rank, *args)
        megalith_comm.barrier()  # nobody leaves (rank 0 hosts the store) before all are done
        return value

    report(rank, run, results)


def report(rank: int, run: Callable[[], Any], results: Any) -> None:
    """Puts run()'s value, or its exception, on the results queue for _collect; then
    flushes the queue and leaves megalith_comm's world if run() joined it."""
    import megalith_comm

    try:
        results.put((rank, "ok", pickle.dumps(run())))
    except BaseException as exc:
        # remote: the error is another rank's failure seen from here (megalith_comm.CommError)
        remote = bool(getattr(exc, "remote", False) or getattr(exc.__cause__, "remote", False))
        results.put((rank, "error", type(exc).__name__, str(exc), traceback.format_exc(), remote))
    finally:
        results.close()
        results.join_thread()
        if megalith_comm.is_initialized():
            megalith_comm.destroy()


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    backend: str = "gloo",
    env: Mapping[str, str] | None = None,
    start_ranks: Sequence[int] | None = None,
) -> list[Any]:
    """Runs fn(rank, *args) on world_size ranks; returns the results in rank order.

    fn must be importable (a module-level function). backend: "gloo" (CPU ranks),
    "nccl" (one GPU per rank; skips the test without them) or "auto" (nccl when
    there are enough GPUs, else gloo). env: extra environment for the ranks;
    MEGALITH_COMM_TIMEOUT defaults to half of timeout (at most 30 s) so a stuck
    collective fails inside the run. start_ranks: start only these ranks (to test
    a rank that never joins); the result list then follows start_ranks. Unless
    OMP_NUM_THREADS is set, each rank gets an equal share of the cores (threads_per_rank).
    """
    if backend == "auto":
        backend = "nccl" if gpus_for(world_size) else "gloo"
    if backend == "nccl" and not gpus_for(world_size):
        _skip(f"needs {world_size} CUDA GPUs (found {torch.cuda.device_count()})")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"run_distributed: backend={backend!r}; expected gloo, nccl or auto")
    ranks = list(range(world_size) if start_ranks is None else start_ranks)
    child_env = {"MEGALITH_COMM_TIMEOUT": str(min(30.0, max(2.0, timeout / 2)))}
    if "OMP_NUM_THREADS" not in os.environ:
        child_env["OMP_NUM_THREADS"] = str(threads_per_rank(len(ranks)))
    child_env.update(env or {})
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    device = "cpu" if backend == "gloo" else "cuda"
    procs = {
        r: ctx.Process(
            target=_child,
            args=(r, world_size, port, fn, args, child_env, device, results),
            name=f"rank{r}",
            daemon=True,
        )
        for r in ranks
    }
    for p in procs.values():
        p.start()
    try:
        return _collect(fn, world_size, ranks, procs, results, timeout)
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
        for p in procs.values():
            p.join(timeout=5)
        results.close()


def _collect(fn, world_size, ranks, procs, results, timeout) -> list[Any]:
    """Results by rank, or the error that best explains the failure.

    A rank's own exception wins over a rank that died silently, which wins over the
    errors other ranks raise about them (CommError.remote), which wait _REMOTE_WAIT_S
    for something better to arrive.
    """
    name = f"{getattr(fn, '__qualname__', fn)} on world size {world_size}"
    done: dict[int, Any] = {}
    remote: list[tuple] = []
    deadline = time.monotonic() + timeout
    exited_at: dict[int, float] = {}
    while len(done) < len(ranks):
        now = time.monotonic()
        if remote and now - remote[0][-1] > _REMOTE_WAIT_S:
            raise _failure(name, remote[0][:-1], remote[1:], results)
        if now >= deadline:
            if remote:
                raise _failure(name, remote[0][:-1], remote[1:], results)
            waiting = [r for r in ranks if r not in done]
            raise DistributedTestError(
                f"{name}: timed out after {timeout:g} s; rank(s) {waiting} had not finished "
                f"(finished: {sorted(done)}). A hang, a missing collective, or too short a timeout."
            )
        try:
            msg = results.get(timeout=min(0.1, deadline - now))
        except queue.Empty:
            msg = None
        if msg is not None and msg[1] == "ok":
            done[msg[0]] = pickle.loads(msg[2])
        elif msg is not None and not msg[-1]:
            raise _failure(name, msg[:-1], remote, results)
        elif msg is not None:
            remote.append((*msg[:-1], now))
        for r, p in procs.items():
            if r in done or p.is_alive() or any(m[0] == r for m in remote):
                continue
            exited_at.setdefault(r, now)
            if now - exited_at[r] > _EXIT_GRACE_S:
                also = "".join(f"\nalso failed: {_summary(m)}" for m in remote)
                raise DistributedTestError(
                    f"{name}: rank {r} exited with code {p.exitcode} without returning "
                    f"(killed, crashed in native code, or called sys.exit){also}",
                    rank=r,
                )
    return [done[r] for r in ranks]


def _summary(msg: tuple) -> str:
    return f"rank {msg[0]} ({msg[2]}: {msg[3].splitlines()[0] if msg[3] else ''})"


def _failure(name: str, first: tuple, known: list, results: Any) -> DistributedTestError:
    """The error for `first`; other errors (known, or arriving within 0.5 s) are listed."""
    others = [_summary(m) for m in known]
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        try:
            msg = results.get(timeout=0.1)
        except queue.Empty:
            continue
        if msg[1] == "error":
            others.append(_summary(msg))
    rank, _, exc_type, text, tb = first[:5]
    also = f"\nalso failed: {'; '.join(others)}" if others else ""
    return DistributedTestError(
        f"{name}: rank {rank} raised {exc_type}: {text}{also}\n\n--- rank {rank} traceback ---\n{tb}",
        rank=rank,
        exc_type=exc_type,
    )


def _grid_worker(rank: int, fn: Callable, settings: Sequence[Any]) -> list[Any]:
    out = []
    for i, setting in enumerate(settings):
        try:
            out.append(fn(rank, setting))
        except Exception as exc:
            raise DistributedTestError(
                f"setting {i} ({setting!r}): {type(exc).__name__}: {exc}", rank, type(exc).__name__
            ) from exc
    return out


def run_grid(
    fn: Callable[[int, Any], Any], settings: Sequence[Any], world_size: int, **kwargs: Any
) -> list[list[Any]]:
    """fn(rank, setting) for each setting, all in one process group.

    Returns results[setting index][rank]. A failure names the setting. kwargs go
    to run_distributed (timeout, backend, env).
    """
    per_rank = run_distributed(_grid_worker, world_size, fn, list(settings), **kwargs)
    return [[per_rank[r][i] for r in range(len(per_rank))] for i in range(len(settings))]
