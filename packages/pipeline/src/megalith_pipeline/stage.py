"""StageModule: the consecutive layers of one stage, run as nn.Sequential would run them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn


class StageModule(nn.Module):
    """Layers first..first+len-1 of the model: each gets the previous one's output as
    its one argument (a tensor, tuple or dict), exactly as in nn.Sequential.

    `layer_ids` are the layers' indices in the whole model (for naming and
    checkpoints); `stage` is the virtual stage this module is.
    """

    def __init__(self, layers: Sequence[nn.Module], first: int, stage: int):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.layer_ids = tuple(range(first, first + len(layers)))
        self.stage = stage

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x

    def extra_repr(self) -> str:
        return f"stage={self.stage}, layers {self.layer_ids[0]}..{self.layer_ids[-1]}"
