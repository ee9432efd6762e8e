"""ColoTensor: ColossalAI's base class of its tensor subclasses, here only the type that
ColoParameter derives from (isinstance(p, ColoTensor) holds for every ColoParameter).
Operators on it return plain tensors, as on a torch.nn.Parameter."""

from __future__ import annotations

import torch


class ColoTensor(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl
