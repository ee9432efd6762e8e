"""megalith.cluster: ColossalAI's DistCoordinator and ProcessGroupMesh on megalith_comm.

from megalith.cluster import DistCoordinator
coordinator = DistCoordinator()
if coordinator.is_master(): ...
"""

from .dist_coordinator import DistCoordinator
from .managers import DeviceMeshManager, ProcessGroupManager
from .process_group_mesh import ProcessGroupMesh

__all__ = ["DeviceMeshManager", "DistCoordinator", "ProcessGroupManager", "ProcessGroupMesh"]
