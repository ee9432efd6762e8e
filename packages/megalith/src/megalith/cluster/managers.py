"""ProcessGroupManager (named groups) and DeviceMeshManager (refused) of colossalai.cluster."""

from __future__ import annotations

from typing import Any

from . import groups


class ProcessGroupManager:
    """Process groups by name: create_process_group(name, ranks), get(name), destroy(name).

    Groups are megalith_comm ProcessGroups; creating one is collective over the world
    (every rank calls it with the same name and ranks; non-members get None)."""

    def __init__(self) -> None:
        self.pg_store: dict[str, Any] = {}

    def create_process_group(self, name: str, ranks: list[int], backend: str = "nccl") -> Any:
        """backend: megalith groups carry Gloo for CPU tensors and NCCL for CUDA ones."""
        if name in self.pg_store:
            raise ValueError(f"process group {name!r} exists already; get it with get({name!r})")
        groups.require_world("ProcessGroupManager.create_process_group")
        import megalith_comm

        self.pg_store[name] = megalith_comm.new_group(ranks, name=name)
        return self.pg_store[name]

    def get(self, name: str) -> Any:
        if name not in self.pg_store:
            raise ValueError(
                f"process group {name!r} does not exist; made: {sorted(self.pg_store)}"
            )
        return self.pg_store[name]

    def destroy(self, name: str) -> None:
        """Forgets the group (megalith_comm closes it when the world is destroyed)."""
        self.get(name)
        del self.pg_store[name]

    def destroy_all(self) -> None:
        self.pg_store.clear()


class DeviceMeshManager:
    """Refused: ColossalAI's auto-parallel DeviceMesh has no counterpart in megalith."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "DeviceMeshManager (ColossalAI's auto-parallel device meshes) is not in megalith; "
            "lay ranks out with megalith.cluster.ProcessGroupMesh(*sizes) or "
            "megalith_comm.Mesh(dp=..., tp=...), and parallelise with HybridParallelPlugin"
        )
