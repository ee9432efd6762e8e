"""ParallelModule: ColossalAI's base of the parallel layers.

As in ColossalAI, `state_dict()` holds each parameter's full tensor (gathered over
the layer's group, so every member must call it) and `load_state_dict` takes full
tensors (each rank keeps its shard); shards are also accepted. With keep_vars=True
the shards themselves are returned: megalith's own tools (full_state_dict, the
plugins) read them and gather through their `tp_spec`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from megalith_comm import ProcessGroup

from ...tensor_parallel.shards import ShardSpec
from ...tensor_parallel.state import gather_full


class ParallelModule(nn.Module):
    group: ProcessGroup

    @staticmethod
    def from_native_module(
        module: nn.Module, process_group: Any = None, **kwargs: Any
    ) -> nn.Module:
        raise NotImplementedError("each parallel layer defines from_native_module")

    @property
    def process_group(self) -> Any:
        """The torch.distributed group under the layer's megalith_comm group."""
        return self.group.gloo if self.group.size > 1 else None

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if keep_vars:
            return
        for name, p in self._parameters.items():
            if p is not None and getattr(p, "tp_spec", None) is not None:
                destination[prefix + name] = gather_full(p, self.group)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        for name, p in self._parameters.items():
            spec: ShardSpec | None = getattr(p, "tp_spec", None)
            key = prefix + name
            if p is None or spec is None or key not in state_dict:
                continue
            value = state_dict[key]
            if tuple(value.shape) == spec.full_shape(p.shape):
                state_dict[key] = spec.take(value, self.group.rank, self.group.size)
        super()._load_from_state_dict(state_dict, prefix, *args)


def place(
    full: torch.Tensor,
    spec: ShardSpec,
    group: ProcessGroup,
    reuse: nn.Parameter | None,
    device: Any,
    dtype: torch.dtype | None,
) -> nn.Parameter:
    """This rank's shard of full as a Parameter: `reuse` itself when given (its data
    replaced, as ColossalAI does, so references to the module's parameter stay valid)."""
    shard = spec.take(full.detach(), group.rank, group.size).to(device=device, dtype=dtype)
    if reuse is None:
        p = nn.Parameter(shard)
    else:
        reuse.data = shard
        p = reuse
    p.tp_spec = spec
    return p


def replicate(
    t: torch.Tensor, reuse: nn.Parameter | None, device: Any, dtype: torch.dtype | None
) -> nn.Parameter:
    if reuse is None:
        return nn.Parameter(t.detach().to(device=device, dtype=dtype))
    reuse.data = reuse.data.to(device=device, dtype=dtype)
    return reuse
