"""ColossalAI's colossalai.tensor names that scripts and tests use: ColoParameter (a
parameter megalith's chunks manage; GeminiPlugin's boosted model holds them) and
ColoTensor, its base."""

from .colo_parameter import ColoParameter, as_colo_parameters
from .colo_tensor import ColoTensor

__all__ = ["ColoParameter", "ColoTensor", "as_colo_parameters"]
