"""The full (unsharded) state dict of a tensor-parallel model, under the original names.

Collective over the tensor-parallel group: every rank gets every full tensor.
"""

from __future__ import annotations

import torch
from torch import nn

import megalith_comm as comm
from megalith_comm import ProcessGroup

from .shards import ShardSpec


def gather_full(
    t: torch.Tensor, group: ProcessGroup, spec: ShardSpec | None = None
) -> torch.Tensor:
    """The full tensor of a shard (spec, else t.tp_spec); a copy of t when it has none."""
    spec = spec or getattr(t, "tp_spec", None)
    t = t.detach()
    if spec is None or group.size == 1:
        return t.clone()
    out = torch.empty((group.size, *t.shape), dtype=t.dtype, device=t.device)
    comm.all_gather(out, t.contiguous(), group=group)
    return spec.join(list(out.unbind(0)))


def full_state_dict(model: nn.Module, group: ProcessGroup | None = None) -> dict[str, torch.Tensor]:
    """model.state_dict() with every shard replaced by the full tensor (tied names kept)."""
    group = group or model.tp_info.group
    seen: dict[int, torch.Tensor] = {}
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen[id(t)] = gather_full(t, group)
        out[name] = seen[id(t)]
    return out


@torch.no_grad()
def load_full_state_dict(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    group: ProcessGroup | None = None,
    strict: bool = True,
) -> None:
    """Copies full (unsharded) tensors into a tensor-parallel model, each rank its shard.

    The inverse of full_state_dict, with no communication: a checkpoint written
    under any tp size (or by the unsharded model, or transformers) loads under this one.
    """
    group = group or model.tp_info.group
    own = model.state_dict(keep_vars=True)
    missing = [k for k in own if k not in state]
    if missing and strict:
        raise KeyError(f"load_full_state_dict: missing {missing[:5]} ({len(missing)} in all)")
    for name, t in own.items():
        if name not in state:
            continue
        spec = getattr(t, "tp_spec", None)
        src = state[name]
        want = spec.full_shape(t.shape) if spec else tuple(t.shape)
        if tuple(src.shape) != want:
            raise ValueError(
                f"load_full_state_dict: {name!r} has shape {list(src.shape)}, the unsharded "
                f"model {list(want)}"
            )
        t.copy_(spec.take(src, group.rank, group.size) if spec else src)
