"""free_other_stages: the storage of the layers this rank does not run, given back.

Every rank builds the whole model and passes it to Pipeline, which keeps this rank's
stages; the other stages' parameters and buffers would otherwise stay alive in the
model the caller still holds, so each rank would carry the whole model. They are
replaced by meta tensors of the same shape (the model keeps its structure and names,
which checkpoints use, and costs no memory for them). A tensor a kept stage also uses
(a weight tied across stages held here) is kept.
"""

from __future__ import annotations

import torch
from torch import nn


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, device="meta")


@torch.no_grad()
def free_other_stages(model: nn.Module, kept: nn.Module) -> int:
    """Moves every parameter and buffer of `model` that `kept` does not hold to the meta
    device (new Parameter objects: a tensor's device cannot change in place; attributes
    such as a tensor-parallel spec are carried over). Returns the elements freed."""
    keep = {id(t) for t in kept.parameters()} | {id(t) for t in kept.buffers()}
    freed = 0
    replaced: dict[int, torch.Tensor] = {}  # a tensor shared by several modules: one meta copy
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or id(p) in keep or p.is_meta:
                continue
            if id(p) not in replaced:
                meta = nn.Parameter(_meta_like(p), requires_grad=p.requires_grad)
                meta.__dict__.update(p.__dict__)
                replaced[id(p)] = meta
                freed += p.numel()
            module._parameters[name] = replaced[id(p)]
        for name, b in list(module._buffers.items()):
            if b is None or id(b) in keep or b.is_meta:
                continue
            if id(b) not in replaced:
                replaced[id(b)] = _meta_like(b)
                freed += b.numel()
            module._buffers[name] = replaced[id(b)]
    return freed
