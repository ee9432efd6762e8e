"""Moving token rows between the ranks of an expert-parallel group.

Each rank sends every (token, chosen expert) row to the rank that holds the expert and
gets back the expert's output for it: two uneven all_to_alls per MoE layer forward, the
same two (splits swapped) in backward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import megalith_comm as comm
from megalith_comm import ProcessGroup


def exchange_counts(send_counts: torch.Tensor, group: ProcessGroup) -> list[int]:
    """How many rows each rank of the group sends to this one, from how many this one
    sends to each (send_counts[j]: rows for rank j)."""
    recv = torch.empty_like(send_counts)
    comm.all_to_all(recv, send_counts.contiguous(), group=group)
    return [int(n) for n in recv.tolist()]


def _exchange(
    rows: torch.Tensor, send: Sequence[int], recv: Sequence[int], group: ProcessGroup
) -> torch.Tensor:
    out = rows.new_empty((sum(recv), *rows.shape[1:]))
    comm.all_to_all(
        out, rows.contiguous(), output_split_sizes=list(recv), input_split_sizes=list(send),
        group=group,
    )  # fmt: skip
    return out


def exchange_rows(
    rows: torch.Tensor, send: Sequence[int], recv: Sequence[int], group: ProcessGroup
) -> torch.Tensor:
    """Not differentiable: send[j] rows of `rows` (in order) go to rank j, recv[i] come
    from rank i."""
    if group.size == 1:
        return rows
    return _exchange(rows, send, recv, group)


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(rows, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def exchange_rows_grad(
    rows: torch.Tensor, send: Sequence[int], recv: Sequence[int], group: ProcessGroup
) -> torch.Tensor:
    """exchange_rows, differentiable: the gradient of each received row goes back to the
    rank (and row) it came from."""
    if group.size == 1:
        return rows
    return _Exchange.apply(rows, list(send), list(recv), group)
