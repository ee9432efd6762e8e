"""DistCoordinator: who this process is in the job, and the helpers that follow from it.

    coordinator = DistCoordinator()
    coordinator.print_on_master(f"world size {coordinator.world_size}")
    with coordinator.priority_execution():     # rank 0 first (e.g. downloads), then the rest
        dataset = load_dataset(...)

One per process (every DistCoordinator() is the same object). rank and world_size
are read from the process group each time, so they follow a later launch. Every
`process_group` argument takes a megalith group or a torch.distributed one (groups.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

from . import groups


class DistCoordinator:
    _instance: DistCoordinator | None = None

    def __new__(cls) -> DistCoordinator:
        groups.require_world("DistCoordinator()")
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    @property
    def rank(self) -> int:
        return groups.rank_in(None)

    @property
    def world_size(self) -> int:
        return groups.size_of(None)

    @property
    def local_rank(self) -> int:
        """The rank on this node (the launcher's LOCAL_RANK; -1 when nothing says it)."""
        world = groups.comm_world()
        if world is not None:
            return world.local_rank
        return int(os.environ.get("LOCAL_RANK", -1))

    def _assert_local_rank_set(self) -> None:
        if self.local_rank < 0:
            raise RuntimeError(
                "DistCoordinator: the local rank is not known (LOCAL_RANK is not set); launch "
                "with torchrun or `megalith run`, or through megalith.launch(local_rank=...)"
            )

    def is_master(self, process_group: Any = None) -> bool:
        """Whether this process is rank 0 (of process_group; None: the world)."""
        return groups.rank_in(process_group) == 0

    def is_node_master(self) -> bool:
        """Whether this process is local rank 0 on its node."""
        self._assert_local_rank_set()
        return self.local_rank == 0

    def is_last_process(self, process_group: Any = None) -> bool:
        return groups.rank_in(process_group) == groups.size_of(process_group) - 1

    def print_on_master(self, msg: str, process_group: Any = None) -> None:
        if self.is_master(process_group):
            print(msg)

    def print_on_node_master(self, msg: str) -> None:
        if self.is_node_master():
            print(msg)

    @contextlib.contextmanager
    def priority_execution(
        self, executor_rank: int = 0, process_group: Any = None
    ) -> Iterator[None]:
        """executor_rank runs the body first; the others wait, then run it."""
        first = groups.rank_in(process_group) == executor_rank
        if not first:
            self.block_all(process_group)
        yield
        if first:
            self.block_all(process_group)

    def block_all(self, process_group: Any = None) -> None:
        """A barrier over process_group (None: the world)."""
        groups.barrier(process_group)

    def destroy(self, process_group: Any = None) -> None:
        """Leaves the job (process_group None); a megalith sub-group lives until then."""
        if process_group is not None:
            if groups.is_comm_group(process_group):
                return  # megalith_comm closes its groups when the world is destroyed
            import torch.distributed as dist

            dist.destroy_process_group(process_group)
            return
        if groups.comm_world() is not None:
            import megalith_comm

            megalith_comm.destroy()
        else:
            import torch.distributed as dist

            dist.destroy_process_group()

    def on_master_only(self, process_group: Any = None) -> Callable[[Callable], Callable]:
        """A decorator: the function runs on the master only (elsewhere it returns None)."""
        is_master = self.is_master(process_group)

        def decorator(func: Callable) -> Callable:
            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return func(*args, **kwargs) if is_master else None

            return wrapper

        return decorator
