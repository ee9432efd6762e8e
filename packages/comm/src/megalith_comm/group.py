"""ProcessGroup: a set of global ranks that communicate, on CPU (Gloo) and CUDA (NCCL).

A group has a Gloo process group of torch.distributed for CPU tensors (also used by
debug mode's signature checks), and, from its first CUDA collective on, one NCCL
communicator of the engine. Groups of one rank have neither: every collective on
them is the identity.

Groups are created collectively: every rank of the world calls `new_group` with the
same arguments in the same order (torch.distributed.new_group's rule); a rank that is
not a member gets None back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import nccl
from .bootstrap import World, get_world
from .errors import CommError
from .mismatch import Agreement


class ProcessGroup:
    """The ranks of one group, as seen from one member.

    ranks: global ranks, ascending (group rank i is ranks[i], as in torch.distributed). rank: this process's rank in the
    group. size: number of ranks. name: unique in the world ("world", "mesh0/dp"...).
    """

    def __init__(self, world: World, name: str, ranks: tuple[int, ...], gloo: Any):
        if world.rank not in ranks:
            raise ValueError(f"rank {world.rank} is not in group {name!r} (ranks {list(ranks)})")
        self.world = world
        self.name = name
        self.ranks = tuple(ranks)
        self.size = len(ranks)
        self.rank = self.ranks.index(world.rank)
        self._index = {r: i for i, r in enumerate(self.ranks)}
        self._gloo = gloo
        self._nccl: Any = None
        self._nccl_device: torch.device | None = None
        self.issued = 0  # collectives issued on this group (health reports it)
        # The always-on mismatch check's state. Its identity is the base name and the
        # members: unique_name's #n counts the groups this rank holds, which can differ
        # between the members (each holds only its own groups).
        self.agreement = Agreement(f"{re.sub(r'#[0-9]+', '', name)}{list(self.ranks)}")
        world.groups[name] = self

    def __repr__(self) -> str:
        return f"ProcessGroup({self.name!r}, ranks={list(self.ranks)}, rank={self.rank})"

    def group_rank(self, global_rank: int) -> int:
        """The rank within this group of a global rank; ValueError if it is not a member."""
        try:
            return self._index[global_rank]
        except KeyError:
            raise ValueError(
                f"rank {global_rank} is not in group {self.name!r} (ranks {list(self.ranks)})"
            ) from None

    def global_rank(self, group_rank: int) -> int:
        if not 0 <= group_rank < self.size:
            raise ValueError(f"group {self.name!r} has ranks 0..{self.size - 1}, not {group_rank}")
        return self.ranks[group_rank]

    @property
    def gloo(self) -> Any:
        """torch.distributed's Gloo group (None for a group of one rank)."""
        if self.size > 1 and self._gloo is None:
            raise CommError(f"group {self.name!r} was destroyed (megalith_comm.destroy())")
        return self._gloo

    def nccl(self, device: torch.device) -> Any:
        """The group's NCCL communicator, created on first use (collective over the group)."""
        if self._nccl is None:
            self._nccl = nccl.create_communicator(self, device)
            self._nccl_device = device
        elif device != self._nccl_device:
            raise ValueError(
                f"group {self.name!r}: this rank's NCCL communicator is on {self._nccl_device}; "
                f"got a tensor on {device}. Use one CUDA device per rank."
            )
        return self._nccl

    def _close(self) -> None:
        if self._nccl is not None:
            try:
                self._nccl.abort()
            except Exception:
                pass
        self._nccl = None
        self._gloo = None


def unique_name(world: World, base: str) -> str:
    """base, or base#2, base#3...: group names (and so store keys) never repeat in a world."""
    name, n = base, 1
    while name in world.groups:
        n += 1
        name = f"{base}#{n}"
    return name


def new_group(
    ranks: Sequence[int], name: str | None = None, exclusive: bool = False
) -> ProcessGroup | None:
    """A group of the given global ranks; collective over the whole world.

    Every rank must call it with the same ranks and name, in the same order as its
    other new_group calls. Returns None on ranks that are not members.
    """
    return new_groups([ranks], name, exclusive)[0]


def new_groups(
    partition: Sequence[Sequence[int]], name: str | None = None, exclusive: bool = False
) -> list[ProcessGroup | None]:
    """One group per entry of partition (lists of global ranks), collectively.

    Returns a list parallel to partition: the ProcessGroup for the entries this
    rank is in, None elsewhere. exclusive=True gives every group its own Gloo
    group even when it spans the world (which otherwise reuses the world's): its
    collectives then never queue behind, or interleave with, another group's,
    so two streams of collectives issued in different orders cannot mismatch.
    """
    world = get_world()
    out: list[ProcessGroup | None] = []
    for i, ranks in enumerate(partition):
        ranks = tuple(sorted(int(r) for r in ranks))
        bad = [r for r in ranks if not 0 <= r < world.world_size]
        if bad or len(set(ranks)) != len(ranks) or not ranks:
            raise ValueError(
                f"new_group: ranks {list(ranks)} must be distinct ranks in [0, {world.world_size})"
            )
        base = name or "group"
        label = f"{base}[{i}]" if len(partition) > 1 else base
        label = unique_name(world, label)
        if len(ranks) == 1:
            gloo = None
        elif ranks == tuple(range(world.world_size)) and not exclusive:
            gloo = dist.group.WORLD
        else:
            # Every rank calls torch's new_group, members or not (its rule).
            gloo = dist.new_group(list(ranks), timeout=timedelta(seconds=world.timeout))
        member = world.rank in ranks
        out.append(ProcessGroup(world, label, ranks, gloo) if member else None)
    return out


def resolve(group: ProcessGroup | None) -> ProcessGroup:
    """group, or the world's group when None."""
    if group is None:
        return get_world().group
    if not isinstance(group, ProcessGroup):
        raise TypeError(
            f"group must be a megalith_comm ProcessGroup (from a Mesh or new_group), got "
            f"{type(group).__name__}"
        )
    return group
