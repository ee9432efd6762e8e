"""ColossalAI's module path colossalai.booster.plugin.torch_ddp_plugin: TorchDDPPlugin lives in torch_ddp.py."""

from .torch_ddp import TorchDDPPlugin

__all__ = ["TorchDDPPlugin"]
