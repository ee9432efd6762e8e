"""What a ColossalAI script may pass as `process_group`: rank and size in any of them.

megalith's groups are megalith_comm ProcessGroups (from ProcessGroupMesh, a plugin or
megalith_comm.new_group); a torch.distributed group works too, when torch.distributed
was set up by the script itself. None is the whole world.
"""

from __future__ import annotations

from typing import Any


def comm_world() -> Any | None:
    """megalith_comm's World when it is initialized, else None."""
    import megalith_comm

    return megalith_comm.get_world() if megalith_comm.is_initialized() else None


def require_world(what: str) -> None:
    import torch.distributed as dist

    if comm_world() is None and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{what}: the process group is not initialized; call megalith.launch_from_torch() "
            "(or megalith.launch(...)) first"
        )


def is_comm_group(group: Any) -> bool:
    from megalith_comm import ProcessGroup

    return isinstance(group, ProcessGroup)


def rank_in(group: Any = None) -> int:
    """This process's rank in group (None: the world)."""
    if is_comm_group(group):
        return group.rank
    world = comm_world()
    if group is None and world is not None:
        return world.rank
    import torch.distributed as dist

    return dist.get_rank(group=group)


def size_of(group: Any = None) -> int:
    if is_comm_group(group):
        return group.size
    world = comm_world()
    if group is None and world is not None:
        return world.world_size
    import torch.distributed as dist

    return dist.get_world_size(group=group)


def barrier(group: Any = None) -> None:
    """Waits until every rank of group is here."""
    import torch.distributed as dist

    if is_comm_group(group) or (group is None and comm_world() is not None):
        import megalith_comm

        megalith_comm.barrier(group=group)
    else:
        dist.barrier(group=group)
