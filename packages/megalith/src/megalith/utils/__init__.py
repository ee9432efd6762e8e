"""megalith.utils: ColossalAI's helpers (colossalai.utils) on megalith.

from megalith.utils import get_current_device, set_seed
"""

from .common import (
    _cast_float,
    conditional_context,
    disposable,
    ensure_path_exists,
    free_storage,
    get_current_device,
    get_non_persistent_buffers_set,
    is_ddp_ignored,
    set_seed,
)
from .multi_tensor_apply import multi_tensor_applier
from .tensor_detector import TensorDetector
from .timer import MultiTimer, Timer

__all__ = [
    "MultiTimer",
    "TensorDetector",
    "Timer",
    "_cast_float",
    "conditional_context",
    "disposable",
    "ensure_path_exists",
    "free_storage",
    "get_current_device",
    "get_non_persistent_buffers_set",
    "is_ddp_ignored",
    "multi_tensor_applier",
    "set_seed",
]
