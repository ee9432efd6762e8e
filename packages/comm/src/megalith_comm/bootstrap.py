"""`init()` and `destroy()`: rendezvous through a TCPStore, then torch.distributed with Gloo.

The sequence on every rank (all before any collective):
1. `LaunchConfig.from_env()` reads and validates rank, world size and master address.
2. store.rendezvous(): rank 0 hosts a TCPStore bound to MASTER_ADDR only (or, under
   torch's elastic agent, the agent's store is used), and every rank checks in; a
   rank that never comes fails init within the timeout, naming how many arrived.
3. torch.distributed's default process group (Gloo, for CPU tensors) starts on that
   store. CUDA tensors use the engine's NCCL communicators, created per group on
   first use (group.py).
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import health, watchdog
from .handle import release_retired
from .launch_env import LaunchConfig
from .store import PREFIX, StoreSpec, rendezvous

DEFAULT_TIMEOUT_S = 300.0


@dataclass(eq=False)
class World:
    """This process's place in the job, and the handles shared by every group."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    timeout: float
    device: torch.device
    store: Any
    source: str = "argument"
    store_spec: StoreSpec | None = None  # how to reach the store (None: world size 1)
    group: Any = None  # the ProcessGroup of all ranks (megalith_comm.group.ProcessGroup)
    heartbeat: watchdog.Heartbeat | None = None
    # (what, since) while the main thread waits for a collective (see [Note: the watchdog])
    blocked: tuple[str, float] | None = None
    restore_excepthook: Callable[[], None] | None = None
    groups: dict[str, Any] = field(default_factory=dict)  # every ProcessGroup by name
    failed: bool = False  # an uncaught exception was reported (health.install_excepthook)

    def __repr__(self) -> str:
        return (
            f"World(rank={self.rank}, world_size={self.world_size}, local_rank={self.local_rank}, "
            f"device={self.device}, master={self.master_addr}:{self.master_port}, "
            f"timeout={self.timeout:g}s, source={self.source!r})"
        )


_WORLD: World | None = None


def timeout_from_env(timeout: float | None = None) -> float:
    """timeout if given, else MEGALITH_COMM_TIMEOUT (seconds), else 300; must be > 0."""
    name = "timeout"
    if timeout is None:
        raw = os.environ.get("MEGALITH_COMM_TIMEOUT")
        if raw is None:
            return DEFAULT_TIMEOUT_S
        name = "MEGALITH_COMM_TIMEOUT"
        try:
            timeout = float(raw)
        except ValueError:
            raise ValueError(f"MEGALITH_COMM_TIMEOUT={raw!r} is not a number of seconds") from None
    if not timeout > 0:
        raise ValueError(f"{name}={timeout!r}: the timeout must be a positive number of seconds")
    return float(timeout)


def get_world() -> World:
    """The World set up by init(); raises if init() has not run."""
    if _WORLD is None:
        raise RuntimeError("megalith_comm is not initialized: call megalith_comm.init() first")
    return _WORLD


def is_initialized() -> bool:
    return _WORLD is not None


def init(
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    local_rank: int | None = None,
    *,
    timeout: float | None = None,
    device: torch.device | str | None = None,
) -> World:
    """Joins the job (idempotent: a second call returns the same World).

    Arguments left as None come from the launcher's environment (torchrun, SLURM,
    OpenMPI; see LaunchConfig.from_env). `timeout` (seconds; default
    MEGALITH_COMM_TIMEOUT or 300) bounds the rendezvous and every collective.
    `device` defaults to cuda:<local_rank> when CUDA is available, else cpu.
    """
    global _WORLD
    explicit = {
        "rank": rank,
        "world_size": world_size,
        "master_addr": master_addr,
        "master_port": master_port,
        "local_rank": local_rank,
    }
    if _WORLD is not None:
        clash = [
            f"{k}={v!r} (initialized with {getattr(_WORLD, k)!r})"
            for k, v in explicit.items()
            if v is not None and v != getattr(_WORLD, k)
        ]
        if clash:
            raise ValueError(
                "megalith_comm.init: already initialized; cannot change "
                + ", ".join(clash)
                + ". Call megalith_comm.destroy() first."
            )
        return _WORLD
    if dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is already initialized by someone else: megalith_comm.init() "
            "sets up its own rendezvous; call it instead of init_process_group()"
        )
    cfg = LaunchConfig.from_env(**explicit)
    seconds = timeout_from_env(timeout)
    dev = _pick_device(cfg.local_rank, device)
    store, spec = rendezvous(cfg, seconds)
    dist.init_process_group(
        backend="gloo",
        store=dist.PrefixStore(PREFIX + "pg", store),
        rank=cfg.rank,
        world_size=cfg.world_size,
        timeout=timedelta(seconds=seconds),
    )
    world = World(
        cfg.rank,
        cfg.world_size,
        cfg.local_rank,
        cfg.master_addr,
        cfg.master_port,
        seconds,
        dev,
        store,
        cfg.source,
        store_spec=spec,
    )
    from .group import ProcessGroup

    world.group = ProcessGroup(world, "world", tuple(range(cfg.world_size)), dist.group.WORLD)
    if cfg.world_size > 1:
        world.heartbeat = watchdog.Heartbeat(world)
        health.install_excepthook(world)
    _WORLD = world
    atexit.unregister(_destroy_at_exit)  # once, however often init() and destroy() alternate
    atexit.register(_destroy_at_exit)
    return world


def _destroy_at_exit() -> None:
    """Leaves cleanly at a normal exit the script did not call destroy() for.

    Without it, Gloo's worker threads outlive the interpreter and a rank can abort
    ("terminate called without an active exception") after its work is done. After an
    uncaught exception the rank skips it: peers may be inside a collective it would wait for.
    """
    world = _WORLD
    if world is not None and not world.failed:
        destroy()


def destroy() -> None:
    """Leaves the job: stops the heartbeat, drops NCCL communicators and Gloo groups."""
    global _WORLD
    world, _WORLD = _WORLD, None
    if world is None:
        return
    if world.heartbeat is not None:
        world.heartbeat.stop()
    if world.restore_excepthook is not None:
        world.restore_excepthook()
    from .p2p import close_links  # p2p builds on the groups: imported late

    close_links()
    for group in world.groups.values():
        group._close()
    world.groups.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
    release_retired()  # see [Note: Gloo works outlive their wait]
    _leave(world)
    world.store = None


# How long rank 0 keeps the store it hosts for ranks that have not left yet.
LEAVE_WAIT_S = 10.0


def _leave(world: World) -> None:
    """Checks out; rank 0, if it hosts the store, waits (bounded) until every rank has, so
    that no rank loses the store while it still needs it (p2p in flight, diagnosis)."""
    if world.store_spec is None:
        return
    try:
        left = world.store.add(PREFIX + "left", 1)
        if world.rank != 0 or world.store_spec.host_rank != 0:
            return
        deadline = time.monotonic() + min(LEAVE_WAIT_S, world.timeout)
        while left < world.world_size and time.monotonic() < deadline:
            time.sleep(0.01)
            left = world.store.add(PREFIX + "left", 0)
    except Exception:  # the store is gone already: nothing to wait for
        pass


def _pick_device(local_rank: int, device: torch.device | str | None) -> torch.device:
    if device is not None:
        dev = torch.device(device)
    elif torch.cuda.is_available() and torch.cuda.device_count() > 0:
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
    else:
        dev = torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev
