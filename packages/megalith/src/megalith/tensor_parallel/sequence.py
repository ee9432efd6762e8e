"""Where the tensor-parallel regions start and end inside a model.

Policies shard a model in place, so the communication around attention and MLP
blocks is added with forward hooks rather than by rewriting their forward:

- enter_region(module): the hidden states going in are made ready for the
  column-parallel layers inside (copy_to_region; under sequence parallelism
  all-gather of the sequence shards). The layers inside then do no input
  communication of their own, so q, k and v share one collective.
- sequence_parallel_span(first, last): the hidden states are split along the
  sequence before `first` and gathered after `last`; in between, layer norms,
  residual adds and dropout run on sequence shards.
- reduce_partial_grads(params): parameters used on sequence shards (norm
  weights) get partial gradients; a hook all-reduces them over the group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

import megalith_comm as comm
from megalith_comm import ProcessGroup

from .regions import copy_to_region, seq_all_gather, seq_gather, seq_split


def _map_hidden(args: tuple, kwargs: dict, fn) -> tuple[tuple, dict]:
    if args:
        return (fn(args[0]), *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}


def enter_region(module: nn.Module, group: ProcessGroup, sequence_parallel: bool) -> None:
    def hook(_mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if sequence_parallel:
            return _map_hidden(args, kwargs, lambda h: seq_all_gather(h, group))
        return _map_hidden(args, kwargs, lambda h: copy_to_region(h, group))

    module.register_forward_pre_hook(hook, with_kwargs=True)


def sequence_parallel_span(first: nn.Module, last: nn.Module, group: ProcessGroup) -> None:
    def split(_mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _map_hidden(args, kwargs, lambda h: _split_checked(h, group))

    def gather(_mod: nn.Module, _args: Any, out: Any) -> Any:
        if isinstance(out, tuple):
            return (seq_gather(out[0], group), *out[1:])
        return seq_gather(out, group)

    first.register_forward_pre_hook(split, with_kwargs=True)
    last.register_forward_hook(gather)


def _split_checked(h: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    if h.shape[1] % group.size:
        raise ValueError(
            f"sequence parallelism over {group.size} ranks needs a sequence length divisible "
            f"by {group.size}; got {h.shape[1]} (hidden states {list(h.shape)})"
        )
    return seq_split(h, group)


def reduce_partial_grads(
    params: Iterable[nn.Parameter], group: ProcessGroup, flag: str = "tp_grad_reduced"
) -> None:
    """All-reduces over group the gradients of params that saw only this rank's tokens,
    once: `flag` marks those already reduced over this group's axis. The Megatron-style
    mode splits the sequence over the tp group itself, so a parameter the tp policy
    already reduces (tp_grad_reduced) is skipped; Ulysses splits it over its own sp
    group, so every parameter is reduced there (flag "sp_grad_reduced")."""
    for p in params:
        if p.requires_grad and not getattr(p, flag, False):
            add_grad_all_reduce(p, group)
            setattr(p, flag, True)


def add_grad_all_reduce(p: nn.Parameter, group: ProcessGroup) -> None:
    """A hook that all-reduces p's gradient over group (p.tp_grad_hook_group remembers
    it, so materialize_sharded can give a replacement parameter the same hook)."""

    def hook(grad: torch.Tensor) -> torch.Tensor:
        out = grad.contiguous().clone()
        comm.all_reduce(out, group=group)
        return out

    p.register_hook(hook)
    p.tp_grad_hook_group = group
