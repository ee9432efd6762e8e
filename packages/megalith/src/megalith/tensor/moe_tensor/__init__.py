"""ColossalAI's colossalai.tensor.moe_tensor (api.py)."""

from .api import is_moe_tensor

__all__ = ["is_moe_tensor"]
