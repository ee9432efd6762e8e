"""megalith_comm: bootstrap, device mesh, process groups and collectives for megalith.

    import megalith_comm as comm
    world = comm.init()                       # from torchrun / SLURM / OpenMPI variables
    mesh = comm.Mesh(world, dp=2, tp=2)
    comm.all_reduce(grad, op="avg", group=mesh.group("dp"))

CPU tensors go through torch.distributed with Gloo, CUDA tensors through the engine's
NCCL communicator; the API is the same. See packages/comm/README.md.
"""

from .bootstrap import World, destroy, get_world, init, is_initialized
from .bucket import Bucketer, Shard, all_reduce_coalesced, reduce_scatter_coalesced
from .collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    reduce,
    reduce_scatter,
)
from .errors import CollectiveMismatchError, CommError
from .group import ProcessGroup, new_group, new_groups
from .handle import Handle
from .launch_env import LaunchConfig, expand_nodelist
from .mesh import Mesh, MeshShape
from .p2p import recv, send

__version__ = "0.1.0"

__all__ = [
    "Bucketer",
    "CollectiveMismatchError",
    "CommError",
    "Handle",
    "LaunchConfig",
    "Mesh",
    "MeshShape",
    "ProcessGroup",
    "Shard",
    "World",
    "__version__",
    "all_gather",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "barrier",
    "broadcast",
    "destroy",
    "expand_nodelist",
    "get_world",
    "init",
    "is_initialized",
    "new_group",
    "new_groups",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_coalesced",
    "send",
]
