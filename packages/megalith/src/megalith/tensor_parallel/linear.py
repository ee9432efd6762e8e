"""Column- and row-parallel linear layers.

Column-parallel: the output features are split, y_local = x W_local^T; the input
must be the same on every rank (copy_to_region) or, under sequence parallelism,
the sequence shards are all-gathered first. Row-parallel: the input features are
split and the partial products summed (all-reduce, or reduce-scatter along the
sequence under sequence parallelism); the bias is added once, after the sum.

Weights keep the layout of the module they replace, so the state dict stays
transformers' layout: nn.Linear's [out, in], or [in, out] (`transposed=True`)
for GPT-2's Conv1D and megalith's InOutLinear.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from megalith_comm import ProcessGroup

from .regions import (
    copy_to_region,
    gather_from_region,
    reduce_from_region,
    scatter_to_region,
    seq_all_gather,
    seq_reduce_scatter,
)
from .shards import ShardSpec, check_divisible, shard_parameter

InputComm = Literal["copy", "seq_all_gather", "none"]


def _layout(module: nn.Module) -> tuple[bool, int, int]:
    """(transposed, in_features, out_features) of an nn.Linear or an [in, out] linear."""
    w = module.weight
    if isinstance(module, nn.Linear):
        return False, w.shape[1], w.shape[0]
    return True, w.shape[0], w.shape[1]


def _weight(w: torch.Tensor, transposed: bool) -> torch.Tensor:
    return w.t() if transposed else w


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's output features split over the tensor-parallel group.

    gather_output: all-gather the output features (else each rank keeps its slice).
    sequence_parallel: the input is a sequence shard [B, S/tp, ...]; gather it first.
    input_comm: override what happens to the input ("none" when the caller has
    already entered the region, e.g. once for q, k and v).
    parts: sizes of logical parts along the output (a fused q|k|v projection), each
    split on its own so every rank holds matching slices of each.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group: ProcessGroup,
        bias: bool = True,
        gather_output: bool = False,
        sequence_parallel: bool = False,
        input_comm: InputComm | None = None,
        transposed: bool = False,
        parts: tuple[int, ...] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        tp = group.size
        self.parts = tuple(parts or (out_features,))
        if sum(self.parts) != out_features:
            raise ValueError(f"parts {self.parts} must add up to out_features ({out_features})")
        for size in self.parts:
            check_divisible("the output features of a column-parallel linear", size, tp)
        self.group = group
        self.in_features, self.out_features = in_features, out_features
        self.local_out = out_features // tp
        self.gather_output = gather_output
        self.sequence_parallel = sequence_parallel
        self.input_comm = input_comm or ("seq_all_gather" if sequence_parallel else "copy")
        self.transposed = transposed
        shape = (in_features, self.local_out) if transposed else (self.local_out, in_features)
        self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.weight.tp_spec = ShardSpec(1 if transposed else 0, self.parts)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.local_out, device=device, dtype=dtype))
            self.bias.tp_spec = ShardSpec(0, self.parts)
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(cls, module: nn.Module, group: ProcessGroup, **kwargs) -> ColumnParallelLinear:
        """This rank's shard of an existing linear (nn.Linear, Conv1D or InOutLinear)."""
        transposed, n_in, n_out = _layout(module)
        bias = getattr(module, "bias", None)
        layer = cls(
            n_in, n_out, group, bias=bias is not None, transposed=transposed,
            device="meta", dtype=module.weight.dtype, **kwargs,
        )  # fmt: skip
        what = f"the output features of {type(module).__name__}({n_in} -> {n_out})"
        layer.weight = shard_parameter(
            module.weight, layer.weight.tp_spec, group.rank, group.size, what
        )
        if bias is not None:
            layer.bias = shard_parameter(bias, layer.bias.tp_spec, group.rank, group.size, what)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_comm == "copy":
            x = copy_to_region(x, self.group)
        elif self.input_comm == "seq_all_gather":
            x = seq_all_gather(x, self.group)
        y = F.linear(x, _weight(self.weight, self.transposed), self.bias)
        return gather_from_region(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features} "
            f"(local {self.local_out}), gather_output={self.gather_output}, "
            f"input={self.input_comm}"
        )


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's input features split over the tensor-parallel group.

    input_is_parallel: x already holds this rank's slice of the features (the
    output of a column-parallel layer); else x is full and sliced here.
    sequence_parallel: the sum is a reduce-scatter along the sequence (dim 1).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group: ProcessGroup,
        bias: bool = True,
        input_is_parallel: bool = True,
        sequence_parallel: bool = False,
        transposed: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        tp = group.size
        self.local_in = check_divisible(
            "the input features of a row-parallel linear", in_features, tp
        )
        self.group = group
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel = sequence_parallel
        self.transposed = transposed
        shape = (self.local_in, out_features) if transposed else (out_features, self.local_in)
        self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.weight.tp_spec = ShardSpec(0 if transposed else 1, (in_features,))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
            # Under sequence parallelism the bias meets only this rank's tokens: its
            # gradient is partial and is all-reduced (copy_to_region in forward).
            self.bias.tp_grad_reduced = sequence_parallel
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(cls, module: nn.Module, group: ProcessGroup, **kwargs) -> RowParallelLinear:
        transposed, n_in, n_out = _layout(module)
        bias = getattr(module, "bias", None)
        layer = cls(
            n_in, n_out, group, bias=bias is not None, transposed=transposed,
            device="meta", dtype=module.weight.dtype, **kwargs,
        )  # fmt: skip
        what = f"the input features of {type(module).__name__}({n_in} -> {n_out})"
        layer.weight = shard_parameter(
            module.weight, layer.weight.tp_spec, group.rank, group.size, what
        )
        if bias is not None:
            layer.bias = nn.Parameter(bias.detach().clone(), requires_grad=bias.requires_grad)
            layer.bias.tp_grad_reduced = layer.sequence_parallel
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_region(x, self.group)
        y = F.linear(x, _weight(self.weight, self.transposed))
        if self.sequence_parallel:
            y = seq_reduce_scatter(y, self.group)
            bias = None if self.bias is None else copy_to_region(self.bias, self.group)
        else:
            y = reduce_from_region(y, self.group)
            bias = self.bias
        return y if bias is None else y + bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features} (local {self.local_in}), "
            f"out_features={self.out_features}, sequence_parallel={self.sequence_parallel}"
        )


class HeadRowsLinear(nn.Module):
    """A full (replicated) projection of which this rank uses some output rows.

    For grouped-query attention with fewer kv heads than ranks: each rank computes
    only the kv heads its query heads read. Every rank keeps the whole weight, and
    its gradient is all-reduced (copy_to_region on the weight), so the replicas see
    the sum of every rank's contribution and stay equal.
    """

    def __init__(self, module: nn.Module, group: ProcessGroup, rows: slice) -> None:
        super().__init__()
        self.transposed, self.in_features, self.out_features = _layout(module)
        self.group, self.rows = group, rows
        self.weight = module.weight
        self.weight.tp_grad_reduced = True
        self.bias = getattr(module, "bias", None)
        if self.bias is not None:
            self.bias.tp_grad_reduced = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = _weight(copy_to_region(self.weight, self.group), self.transposed)[self.rows]
        b = None if self.bias is None else copy_to_region(self.bias, self.group)[self.rows]
        return F.linear(x, w, b)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, rows={self.rows.start}:{self.rows.stop} of {self.out_features}"
