"""get_static_torch_model: a plain torch module with a ZeRO model's full values."""

from __future__ import annotations

import copy
from typing import Any

import torch


def get_static_torch_model(
    zero_ddp_model: Any,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    only_rank_0: bool = True,
) -> torch.nn.Module:
    """A deep copy of the user's module holding every parameter's fp32 master value
    (whole, tensor-parallel shards gathered) and buffer, in `dtype` on `device`.
    Collective: every rank calls it; with only_rank_0 the other ranks get the copy
    with the values left as the boosted model's own (their state dict is empty)."""
    full = zero_ddp_model.state_dict(only_rank_0=only_rank_0)
    module = copy.deepcopy(zero_ddp_model.unwrap())
    with torch.no_grad():
        for name, p in list(module.named_parameters()):
            owner, _, leaf = name.rpartition(".")
            parent = module.get_submodule(owner) if owner else module
            value = full.get(name, p.detach())
            parent._parameters[leaf] = torch.nn.Parameter(
                value.to(device=device, dtype=dtype), requires_grad=p.requires_grad
            )
        for name, b in list(module.named_buffers()):
            owner, _, leaf = name.rpartition(".")
            parent = module.get_submodule(owner) if owner else module
            value = full.get(name, b)
            cast = dtype if value.is_floating_point() else value.dtype
            parent._buffers[leaf] = value.to(device=device, dtype=cast)
    return module
