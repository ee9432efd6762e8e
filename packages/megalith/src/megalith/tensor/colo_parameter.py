"""ColoParameter: a parameter whose memory megalith's chunks manage (ColossalAI's name).

GeminiPlugin's boosted model holds ColoParameters: each one's values are a view of a
ZeRO stage-3 chunk (gathered before its module runs, released after), so code can tell
a chunk-managed parameter from a plain one with isinstance. Built directly, it is a
torch.nn.Parameter like any other: torch's operators see a plain parameter (no op
hooks: megalith's gathers are module hooks, not tensor ones).
"""

from __future__ import annotations

import torch

from .colo_tensor import ColoTensor


class ColoParameter(ColoTensor, torch.nn.Parameter):
    def __new__(cls, data: torch.Tensor | None = None, requires_grad: bool = True) -> ColoParameter:
        if data is None:
            data = torch.empty(0)
        return torch.Tensor._make_subclass(cls, data, requires_grad)

    def __repr__(self) -> str:
        return "ColoParameter containing:\n" + torch.Tensor.__repr__(self.data)


def as_colo_parameters(module: torch.nn.Module) -> None:
    """Every plain Parameter of module becomes a ColoParameter in place (the same
    object, so optimizers, hooks and chunk views that hold it stay valid)."""
    for p in module.parameters():
        if type(p) is torch.nn.Parameter:
            p.__class__ = ColoParameter
