"""megalith_offload: where ZeRO's fp32 masters and optimizer states live.

Tiers: "device" (beside the parameters), "host" (pinned host memory when CUDA is
there, else host memory, from the engine's resources) and "nvme" (files in a
per-run swap directory through the engine's async I/O, read back before a
chunk's step and written after it, the next chunk's read overlapping the step).

    import megalith_zero as zero
    from megalith_offload import OffloadConfig
    cfg = zero.ZeroConfig(stage=2, offload=OffloadConfig(tier="nvme", swap_dir="/nvme/tmp"))

See packages/offload/README.md.
"""

from . import auto
from .config import PLACEMENTS, TIERS, OffloadConfig
from .host import ALIGNMENT, HostTier, host_resource
from .offloader import Offloader
from .placement import HOST_STEP_SLOTS, ChunkCost, Plan, plan
from .swap import SwapStore, file_bytes

__version__ = "0.1.0"

__all__ = [
    "ALIGNMENT",
    "HOST_STEP_SLOTS",
    "PLACEMENTS",
    "TIERS",
    "ChunkCost",
    "HostTier",
    "OffloadConfig",
    "Offloader",
    "Plan",
    "SwapStore",
    "__version__",
    "auto",
    "file_bytes",
    "host_resource",
    "plan",
]
