"""ColossalAI's module path colossalai.booster.plugin.torch_fsdp_plugin: TorchFSDPPlugin lives in torch_fsdp.py."""

from .torch_fsdp import TorchFSDPPlugin

__all__ = ["TorchFSDPPlugin"]
