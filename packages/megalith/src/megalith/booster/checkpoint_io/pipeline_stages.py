"""Model and optimizer checkpoints of a pipelined model (HybridParallelPlugin, pp_size > 1).

Files are the whole model's full tensors (and full optimizer states) under the
model's own names, the same files as every other plugin writes, so they load under
any tp x pp x dp layout, a plain model, or transformers. Each pp rank holds its
stages (gathered over tp when sharded, and over dp under ZeRO); world rank 0
collects the stages over its pp group and writes, so it holds the whole model's
tensors (or optimizer states) in host memory once. A weight tied across stages
(TiedParams) is written once, by the lowest stage holding it. On load, each rank
reads the tensors of its own stages (and shards them over tp, and dp under ZeRO).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


def _local_ids(model: Any) -> set[int]:
    stages = model.unwrap()
    return {id(t) for t in stages.parameters()} | {id(t) for t in stages.buffers()}


def _names(whole: torch.nn.Module) -> dict[str, int]:
    return {name: id(t) for name, t in whole.state_dict(keep_vars=True).items()}


def gather_stages(model: Any, part: Any) -> list[Any] | None:
    """Every pp rank's part on world rank 0, in pp rank order (None elsewhere). Only rank
    0's pp group takes part; the other ranks return None at once."""
    pp = model.mesh.group("pp")
    if 0 not in pp.ranks:
        return None
    parts: list[Any] | None = [None] * pp.size if pp.rank == 0 else None
    dist.gather_object(part, parts, dst=0, group=pp.gloo)
    return parts


def full_state(model: Any, stage_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The whole model's tensors on world rank 0 (the writer; empty elsewhere), from
    stage_state: this rank's view of the whole model (full tensors: gathered over tp),
    of which only its stages are live. Only rank 0's pp group sends them."""
    ids, local = _names(model.whole), _local_ids(model)
    mine = {k: v.cpu() for k, v in stage_state.items() if ids.get(k) in local}
    parts = gather_stages(model, mine)
    if parts is None:
        return {}
    merged: dict[str, torch.Tensor] = {}
    for part in parts:  # a tied weight comes from each stage holding it, equal after a step
        merged.update(part)
    return {k: merged[k] for k in ids if k in merged}


def stage_file_names(model: Any) -> dict[str, str]:
    """This rank's stages' parameter names (as ZeRO knows them) to their whole-model names."""
    whole = {}
    for name, p in model.whole.named_parameters():
        whole.setdefault(id(p), name)
    return {n: whole[id(p)] for n, p in model.unwrap().named_parameters() if id(p) in whole}


def full_optimizer_states(
    model: Any,
    plan: list[tuple[str, int]],
    params: dict[str, dict[str, int]],
    states: Iterable[tuple[str, torch.Tensor]],
    sep: str,
) -> tuple[list[tuple[str, int]], dict[str, dict[str, int]], dict[str, torch.Tensor]]:
    """The whole model's optimizer plan, "params" and full states on world rank 0 (empty
    elsewhere), from this rank's stages' (keys "<whole-model name><sep><state>"). Every
    rank runs through `states` (it may be collective over tp and dp); a tied weight's
    secondary copies are left out, so it is written once."""
    names = {id(p): n for n, p in model.whole.named_parameters()}
    skip = {names[id(p)] for p in model.pipe.tied.secondary_copies() if id(p) in names}
    if 0 not in model.mesh.group("pp").ranks:  # not a sender: take part in the gathers only
        for _ in states:
            pass
        return [], {}, {}
    mine = (
        [(k, n) for k, n in plan if k.split(sep, 1)[0] not in skip],
        {k: v for k, v in params.items() if k not in skip},
        {k: t for k, t in states if k.split(sep, 1)[0] not in skip},
    )
    parts = gather_stages(model, mine)
    if parts is None:
        return [], {}, {}
    order = {n: i for i, (n, _) in enumerate(model.whole.named_parameters())}

    def position(key: str) -> int:
        return order.get(key.split(sep, 1)[0], len(order))

    merged_plan = {k: n for p, _, _ in parts for k, n in p}
    merged_params = {k: v for _, p, _ in parts for k, v in p.items()}
    tensors = {k: t for _, _, part in parts for k, t in part.items()}
    plan_out = sorted(merged_plan.items(), key=lambda kv: position(kv[0]))
    params_out = dict(sorted(merged_params.items(), key=lambda kv: position(kv[0])))
    return plan_out, params_out, tensors


def local_names(model: Any) -> set[str]:
    """The names (in the whole model) of the tensors this rank's stages hold."""
    local = _local_ids(model)
    return {k for k, i in _names(model.whole).items() if i in local}
