"""Randomizer: ColossalAI's `colossalai.shardformer.layer.utils.Randomizer`.

The class-level index is the one megalith's dropout layers take their seed offsets from
(dropout.py): each new DropoutForParallelInput / DropoutForReplicatedInput takes the
next index. Scripts and tests call `Randomizer.reset_index()` before building a model a
second time so that its dropouts draw the same masks as the first one's. An instance
runs code under a random stream of its own seed (`fork_rng`), leaving the caller's
stream as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from . import dropout


class Randomizer:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.cpu_rng_state = torch.get_rng_state()
        self.device_rng_state = None
        if torch.cuda.is_available():
            with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
                torch.cuda.manual_seed(seed)
                self.device_rng_state = torch.cuda.get_rng_state()

    @contextlib.contextmanager
    def fork_rng(self, enable_cpu: bool = False) -> Iterator[None]:
        """Run under this randomizer's stream (the device's, and the CPU's when asked or
        when there is no GPU), then keep its advanced state for the next call."""
        cuda = self.device_rng_state is not None
        use_cpu = enable_cpu or not cuda
        devices = [torch.cuda.current_device()] if cuda else []
        with torch.random.fork_rng(devices=devices):
            if cuda:
                torch.cuda.set_rng_state(self.device_rng_state)
            if use_cpu:
                torch.set_rng_state(self.cpu_rng_state)
            yield
            if cuda:
                self.device_rng_state = torch.cuda.get_rng_state()
            if use_cpu:
                self.cpu_rng_state = torch.get_rng_state()

    @staticmethod
    def index() -> int:
        """The index the next dropout layer takes."""
        return dropout._index[0]

    @staticmethod
    def increment_index() -> None:
        dropout._index[0] += 1

    @staticmethod
    def reset_index() -> None:
        """The next dropout layer takes index 0 again (as the first one built did)."""
        dropout._index[0] = 0

    @staticmethod
    def is_randomizer_index_synchronized(process_group: Any = None) -> bool:
        """Whether every rank of the group (None: the world) is at the same index."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return True
        mine = [Randomizer.index()]
        every: list[Any] = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(every, mine[0], group=process_group)
        return len(set(every)) == 1

    @staticmethod
    def synchronize_index(process_group: Any = None) -> None:
        """Every rank of the group takes the largest index any of them is at."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        every: list[Any] = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(every, Randomizer.index(), group=process_group)
        dropout._index[0] = max(every)


__all__ = ["Randomizer"]
