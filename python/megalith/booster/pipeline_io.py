"""Model checkpoints of a pipelined model (HybridParallelPlugin, pp_size > 1).

Files are the whole model's full tensors under the model's own names, the same
files as every other plugin writes, so they load under any tp x pp x dp layout, a
plain model, or transformers. Each pp rank holds its stages (gathered over tp
when sharded); world rank 0 collects the stages over its pp group and writes. On load,
each rank reads the tensors of its own stages (and shards them over tp).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _local_ids(model: Any) -> set[int]:
    stages = model.unwrap()
    return {id(t) for t in stages.parameters()} | {id(t) for t in stages.buffers()}


def _names(whole: torch.nn.Module) -> dict[str, int]:
    return {name: id(t) for name, t in whole.state_dict(keep_vars=True).items()}


def full_state(model: Any, stage_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The whole model's tensors on world rank 0 (the writer; empty elsewhere), from
    stage_state: this rank's view of the whole model (full tensors: gathered over tp),
    of which only its stages are live. Only rank 0's pp group sends them."""
    pp = model.mesh.group("pp")
    if 0 not in pp.ranks:
        return {}
    ids, local = _names(model.whole), _local_ids(model)
    mine = {k: v.cpu() for k, v in stage_state.items() if ids.get(k) in local}
    parts: list[Any] | None = [None] * pp.size if pp.rank == 0 else None
    dist.gather_object(mine, parts, dst=0, group=pp.gloo)
    if parts is None:
        return {}
    merged: dict[str, torch.Tensor] = {}
    for part in parts:  # a tied weight comes from each stage holding it, equal after a step
        merged.update(part)
    return {k: merged[k] for k in ids if k in merged}


def local_names(model: Any) -> set[str]:
    """The names (in the whole model) of the tensors this rank's stages hold."""
    local = _local_ids(model)
    return {k for k, i in _names(model.whole).items() if i in local}
