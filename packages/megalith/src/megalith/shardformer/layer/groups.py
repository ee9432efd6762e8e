"""The `process_group` a ColossalAI layer is given, as the megalith_comm group it runs on.

ColossalAI scripts pass a torch.distributed group (a plugin's `tp_group`, a
`ProcessGroupMesh` group, `dist.new_group(...)`), a one-element list of one, or None
(the whole world). megalith's layers communicate through megalith_comm, so each is
mapped to the megalith_comm group of the same members. A torch group megalith_comm
has not made itself is wrapped as it is: the wrapper reuses the torch group for CPU
tensors and runs no collective to be built, so every rank can wrap its own group.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

import megalith_comm
from megalith_comm import ProcessGroup


def comm_group(process_group: Any, what: str) -> ProcessGroup:
    if isinstance(process_group, (list, tuple)):
        if len(process_group) != 1:
            raise ValueError(
                f"{what}: expected one process group, got {len(process_group)}; pass the "
                "tensor-parallel group alone"
            )
        process_group = process_group[0]
    if isinstance(process_group, ProcessGroup):
        return process_group
    if not megalith_comm.is_initialized():
        raise RuntimeError(
            f"{what}: the process group is not initialized; call megalith.launch(...) or "
            "megalith.launch_from_torch() before building parallel layers"
        )
    world = megalith_comm.get_world()
    if process_group is None or process_group is dist.group.WORLD:
        return world.group
    ranks = tuple(sorted(dist.get_process_group_ranks(process_group)))
    if world.rank not in ranks:
        raise ValueError(f"{what}: this rank ({world.rank}) is not in the group {list(ranks)}")
    known = [g for g in world.groups.values() if g.ranks == ranks]
    for g in known:
        if g.size > 1 and g._gloo is process_group:
            return g
    if known:
        return known[0]
    from megalith_comm.group import unique_name

    name = unique_name(world, f"torch{list(ranks)}")
    return ProcessGroup(world, name, ranks, process_group if len(ranks) > 1 else None)
