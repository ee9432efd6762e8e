"""LayerNorm, RMSNorm, FusedLayerNorm, FusedRMSNorm: ColossalAI's names for the model's
own norms. As in ColossalAI they are not classes to build: `from_native_module` returns
the module itself (the fused kernels compute the same values), materialized, and with
`sp_partial_derived=True` marks its parameters `partial_derived` (their gradients come
from a part of the sequence and need a sum over the sequence-parallel group, which the
plugin does).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...lazy import LazyInitContext


class BaseLayerNorm:
    def __init__(self) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} is not built directly; call "
            f"{type(self).__name__}.from_native_module(module) on the model's own norm"
        )

    @staticmethod
    def from_native_module(
        module: nn.Module, sp_partial_derived: bool = False, *args: Any, **kwargs: Any
    ) -> nn.Module:
        LazyInitContext.materialize(module)
        if sp_partial_derived:
            for p in (getattr(module, "weight", None), getattr(module, "bias", None)):
                if isinstance(p, nn.Parameter):
                    p.partial_derived = True
        return module


class LayerNorm(BaseLayerNorm):
    pass


class FusedLayerNorm(BaseLayerNorm):
    pass


class RMSNorm(BaseLayerNorm):
    pass


class FusedRMSNorm(BaseLayerNorm):
    pass
