"""The communication of tensor and sequence parallelism, written once as autograd Functions.

Each function is a pair (forward, backward) of collectives over the tensor-parallel
group; the layers only say which pair they need:

    copy_to_region       identity          | all-reduce         (enter a TP region)
    reduce_from_region   all-reduce        | identity           (leave it, row-parallel)
    gather_from_region   all-gather last   | keep own slice     (column output -> full)
    scatter_to_region    keep own slice    | all-gather last    (full -> row input)
    seq_all_gather       all-gather dim d  | reduce-scatter d   (SP: enter a TP region)
    seq_reduce_scatter   reduce-scatter d  | all-gather d       (SP: leave it)
    seq_split            keep own slice d  | all-gather d       (enter the SP part)
    seq_gather           all-gather dim d  | keep own slice d   (leave the SP part)

A group of one rank makes every one of them the identity.
"""

from __future__ import annotations

import torch

import megalith_comm as comm
from megalith_comm import ProcessGroup


def _all_gather(x: torch.Tensor, dim: int, group: ProcessGroup) -> torch.Tensor:
    if group.size == 1:
        return x
    x = x.contiguous()
    out = torch.empty((group.size, *x.shape), dtype=x.dtype, device=x.device)
    comm.all_gather(out, x, group=group)
    return torch.cat(out.unbind(0), dim=dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group: ProcessGroup) -> torch.Tensor:
    if group.size == 1:
        return x
    if x.shape[dim] % group.size:
        raise ValueError(
            f"reduce-scatter along dim {dim}: size {x.shape[dim]} is not divisible by the "
            f"tensor-parallel size {group.size}"
        )
    stacked = torch.stack(x.chunk(group.size, dim=dim)).contiguous()
    out = torch.empty(stacked.shape[1:], dtype=x.dtype, device=x.device)
    comm.reduce_scatter(out, stacked, group=group)
    return out


def _all_reduce(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    if group.size == 1:
        return x
    out = x.contiguous().clone()
    comm.all_reduce(out, group=group)
    return out


def _slice(x: torch.Tensor, dim: int, group: ProcessGroup) -> torch.Tensor:
    if group.size == 1:
        return x
    if x.shape[dim] % group.size:
        raise ValueError(
            f"splitting dim {dim} of shape {list(x.shape)} over {group.size} tensor-parallel "
            f"ranks: {x.shape[dim]} is not divisible by {group.size}"
        )
    return x.chunk(group.size, dim=dim)[group.rank].contiguous()


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherAlong(torch.autograd.Function):
    """Forward all-gather along dim; backward keeps this rank's slice (no communication)."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _slice(grad, ctx.dim, ctx.group), None, None


class _SplitAlong(torch.autograd.Function):
    """Forward keeps this rank's slice along dim; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _slice(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


class _AllGatherReduceScatter(torch.autograd.Function):
    """Forward all-gather along dim; backward reduce-scatter (the input was replicated work)."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.dim, ctx.group), None, None


class _ReduceScatterAllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


def copy_to_region(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _CopyToRegion.apply(x, group)


def reduce_from_region(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _ReduceFromRegion.apply(x, group)


def gather_from_region(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _GatherAlong.apply(x, x.dim() - 1, group)


def scatter_to_region(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _SplitAlong.apply(x, x.dim() - 1, group)


def seq_all_gather(x: torch.Tensor, group: ProcessGroup, dim: int = 1) -> torch.Tensor:
    return _AllGatherReduceScatter.apply(x, dim, group)


def seq_reduce_scatter(x: torch.Tensor, group: ProcessGroup, dim: int = 1) -> torch.Tensor:
    return _ReduceScatterAllGather.apply(x, dim, group)


def seq_split(x: torch.Tensor, group: ProcessGroup, dim: int = 1) -> torch.Tensor:
    return _SplitAlong.apply(x, dim, group)


def seq_gather(x: torch.Tensor, group: ProcessGroup, dim: int = 1) -> torch.Tensor:
    return _GatherAlong.apply(x, dim, group)
