"""ColossalAI's colossalai.tensor.moe_tensor.api: what an expert weight knows of its groups.

MoeHybridParallelPlugin marks each expert weight it splits (megalith.moe.experts
mark_expert_param): its ep group (the ranks splitting its experts) and its moe_dp group
(the ranks holding the same experts). The groups returned here are torch.distributed
ProcessGroups, as ColossalAI's are, for torch.distributed calls; a group of one rank is
this rank's own one-rank group.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_SINGLE: dict[int, Any] = {}


def is_moe_tensor(tensor: torch.Tensor) -> bool:
    """Whether tensor is an expert weight split by expert parallelism."""
    return hasattr(tensor, "ep_spec")


def _group(tensor: torch.Tensor, attr: str) -> Any:
    if not is_moe_tensor(tensor):
        raise ValueError(
            "not an expert weight: MoeHybridParallelPlugin marks the experts it splits at "
            "boost(); check is_moe_tensor(tensor) first"
        )
    return getattr(tensor, attr)


def _torch_group(group: Any) -> Any:
    if group.size > 1:
        return group.gloo
    rank = dist.get_rank()
    if rank not in _SINGLE:  # only this rank takes part in making its own group
        _SINGLE[rank] = dist.new_group([rank], use_local_synchronization=True)
    return _SINGLE[rank]


def get_ep_group(tensor: torch.Tensor) -> Any:
    return _torch_group(_group(tensor, "ep_group"))


def get_dp_group(tensor: torch.Tensor) -> Any:
    """The ranks holding the same experts (ColossalAI's moe dp group)."""
    return _torch_group(_group(tensor, "moe_dp_group"))


def get_ep_size(tensor: torch.Tensor) -> int:
    return _group(tensor, "ep_group").size


def get_dp_size(tensor: torch.Tensor) -> int:
    return _group(tensor, "moe_dp_group").size


def get_ep_rank(tensor: torch.Tensor) -> int:
    return _group(tensor, "ep_group").rank


def get_dp_rank(tensor: torch.Tensor) -> int:
    return _group(tensor, "moe_dp_group").rank


def get_ep_group_ranks(tensor: torch.Tensor) -> list[int]:
    return list(_group(tensor, "ep_group").ranks)


def get_dp_group_ranks(tensor: torch.Tensor) -> list[int]:
    return list(_group(tensor, "moe_dp_group").ranks)


def set_moe_tensor_ep_group(tensor: torch.Tensor, ep_group: Any) -> None:
    raise ValueError(
        "set_moe_tensor_ep_group: megalith's experts get their groups from "
        "MoeHybridParallelPlugin(ep_size=...) at boost(); build the model plainly and boost it"
    )


__all__ = [
    "get_dp_group",
    "get_dp_group_ranks",
    "get_dp_rank",
    "get_dp_size",
    "get_ep_group",
    "get_ep_group_ranks",
    "get_ep_rank",
    "get_ep_size",
    "is_moe_tensor",
    "set_moe_tensor_ep_group",
]
