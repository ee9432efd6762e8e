"""megalith.interface: the boosted objects' base classes, under ColossalAI's names.

ModelWrapper and OptimizerWrapper are the Booster's own (megalith.booster.wrappers):
what Booster.boost returns is an instance of them.
"""

from megalith.booster.wrappers import ModelWrapper, OptimizerWrapper

from .model import AMPModelMixin
from .pretrained import get_pretrained_path, set_pretrained_path

__all__ = [
    "AMPModelMixin",
    "ModelWrapper",
    "OptimizerWrapper",
    "get_pretrained_path",
    "set_pretrained_path",
]
