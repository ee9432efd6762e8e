"""megalith_offload: where ZeRO's fp32 masters and optimizer states live.

Tiers: "device" (beside the parameters), "host" (pinned host memory when CUDA is
there, else host memory, from the engine's resources) and "nvme" (files in a
per-run swap directory through the engine's async I/O, read back before a
chunk's step and written after it, the next chunk's read overlapping the step).
The Offloader records where each chunk is and moves it; HostTier and NvmeTier update
the chunks of their tier. Chunks are anything shaped like OffloadableChunk (megalith_zero's
FlatChunk is one): this package never imports megalith_zero.

    import megalith_zero as zero
    from megalith_offload import OffloadConfig
    cfg = zero.ZeroConfig(stage=2, offload=OffloadConfig(tier="nvme", swap_dir="/nvme/tmp"))

See packages/offload/README.md.
"""

from megalith_core.memory import HOST_ALIGNMENT as ALIGNMENT

from . import auto
from .chunk import ChunkUpdate, OffloadableChunk
from .config import PLACEMENTS, TIERS, OffloadConfig
from .host_step import HostStepper
from .host_tier import HostTier
from .nvme_tier import NvmeTier
from .offloader import Offloader
from .placement import HOST_STEP_SLOTS, ChunkCost, Plan, plan
from .resident import resident_states, swapped_states
from .swap import SwapStore, file_bytes, lean_file_bytes
from .visit import DeviceVisits, link_seconds_per_byte
from .warmup import AutoPlacement

__version__ = "0.1.0"

__all__ = [
    "ALIGNMENT",
    "HOST_STEP_SLOTS",
    "PLACEMENTS",
    "TIERS",
    "AutoPlacement",
    "ChunkCost",
    "ChunkUpdate",
    "DeviceVisits",
    "HostStepper",
    "HostTier",
    "NvmeTier",
    "OffloadConfig",
    "OffloadableChunk",
    "Offloader",
    "Plan",
    "SwapStore",
    "__version__",
    "auto",
    "file_bytes",
    "lean_file_bytes",
    "link_seconds_per_byte",
    "plan",
    "resident_states",
    "swapped_states",
]
