"""GPT2FusedLinearConv1D_Col / _Row: GPT-2's Conv1D ([in, out] weight) split over ranks.

The column form takes `split_sizes` (GPT-2's fused q|k|v): each part is split on its
own, so every rank holds its slice of q, of k and of v, and a gathered output is put
back in the full q|k|v order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...lazy import LazyInitContext
from ...tensor_parallel.linear import ColumnParallelLinear, RowParallelLinear
from ...tensor_parallel.regions import copy_to_region, gather_from_region, seq_all_gather
from .groups import comm_group
from .linear import _check_bias_args, _full_weight, row_forward
from .options import check_common, initialize, sequence_shares_tp
from .parallel_module import ParallelModule, place, replicate


def _parts_in_full_order(y: torch.Tensor, parts: tuple[int, ...], tp: int) -> torch.Tensor:
    """[p0_r0 p1_r0 .. p0_r1 p1_r1 ..] (a gather of per-rank slices) -> [p0 p1 ..]."""
    if len(parts) == 1 or tp == 1:
        return y
    local = [p // tp for p in parts]
    chunks = y.split(local * tp, dim=-1)
    order = [chunks[r * len(parts) + i] for i in range(len(parts)) for r in range(tp)]
    return torch.cat(order, dim=-1)


def _conv1d_sizes(module: nn.Module, what: str) -> tuple[int, int]:
    LazyInitContext.materialize(module)
    w = getattr(module, "weight", None)
    if w is None or w.dim() != 2:
        raise TypeError(
            f"{what}.from_native_module takes GPT-2's Conv1D, got {type(module).__name__}"
        )
    return w.shape[0], w.shape[1]


class GPT2FusedLinearConv1D_Col(ColumnParallelLinear, ParallelModule):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        split_sizes: list[int] | None = None,
        bias: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        process_group: Any = None,
        gather_output: bool = False,
        seq_parallel_mode: str | None = None,
        skip_bias_add: bool = False,
        weight: nn.Parameter | None = None,
        bias_: nn.Parameter | None = None,
        weight_initializer: Callable | None = None,
        bias_initializer: Callable | None = None,
        fp8_communication: bool = False,
        use_zbv: bool = False,
        **kwargs: Any,
    ) -> None:
        what = type(self).__name__
        _check_bias_args(what, bias, weight, bias_, skip_bias_add)
        check_common(what, fp8_communication, use_zbv, kwargs)
        parts = tuple(split_sizes or (out_features,))
        if sum(parts) != out_features:
            raise ValueError(f"{what}: split_sizes {list(parts)} must add up to {out_features}")
        group = comm_group(process_group, what)
        shares = sequence_shares_tp(seq_parallel_mode, what)
        super().__init__(
            in_features, out_features, group, bias=bias, gather_output=gather_output,
            sequence_parallel=shares, transposed=True, parts=parts, device="meta", dtype=dtype,
        )  # fmt: skip
        self.split_sizes, self.seq_parallel_mode = list(parts), seq_parallel_mode
        self.skip_bias_add = skip_bias_add
        device = device if weight is None or device is not None else weight.device
        full = _full_weight(
            (in_features, out_features), weight, device, dtype, weight_initializer,
            in_features, out_features,
        )  # fmt: skip
        self.weight = place(full, self.weight.tp_spec, group, weight, device, dtype)
        if bias:
            b = bias_.detach() if bias_ is not None else torch.empty(out_features, device=device)
            if bias_ is None:
                initialize(b, in_features, out_features, bias_initializer, "bias")
            self.bias = place(b, self.bias.tp_spec, group, bias_, device, dtype)

    @staticmethod
    def from_native_module(
        module: nn.Module,
        process_group: Any = None,
        split_sizes: list[int] | None = None,
        **kwargs: Any,
    ) -> nn.Module:
        n_in, n_out = _conv1d_sizes(module, "GPT2FusedLinearConv1D_Col")
        return GPT2FusedLinearConv1D_Col(
            n_in, n_out, split_sizes=split_sizes, bias=module.bias is not None,
            device=module.weight.device, process_group=comm_group(process_group, "GPT2FusedLinearConv1D_Col"),
            weight=module.weight, bias_=module.bias, **kwargs,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> Any:
        x = (
            seq_all_gather(x, self.group)
            if self.sequence_parallel
            else copy_to_region(x, self.group)
        )
        y = F.linear(x, self.weight.t(), None if self.skip_bias_add else self.bias)
        if self.gather_output:
            y = _parts_in_full_order(gather_from_region(y, self.group), self.parts, self.group.size)
        return (y, self.bias) if self.skip_bias_add else y


class GPT2FusedLinearConv1D_Row(RowParallelLinear, ParallelModule):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        process_group: Any = None,
        seq_parallel_mode: str | None = None,
        parallel_input: bool = True,
        skip_bias_add: bool = False,
        weight: nn.Parameter | None = None,
        bias_: nn.Parameter | None = None,
        weight_initializer: Callable | None = None,
        bias_initializer: Callable | None = None,
        stream_chunk_num: int = 1,
        fp8_communication: bool = False,
        use_zbv: bool = False,
        **kwargs: Any,
    ) -> None:
        what = type(self).__name__
        _check_bias_args(what, bias, weight, bias_, skip_bias_add)
        if stream_chunk_num != 1:
            kwargs["stream_chunk_num"] = stream_chunk_num
        check_common(what, fp8_communication, use_zbv, kwargs)
        group = comm_group(process_group, what)
        shares = sequence_shares_tp(seq_parallel_mode, what)
        super().__init__(
            in_features, out_features, group, bias=bias, input_is_parallel=parallel_input,
            sequence_parallel=shares, transposed=True, device="meta", dtype=dtype,
        )  # fmt: skip
        self.parallel_input, self.seq_parallel_mode = parallel_input, seq_parallel_mode
        self.skip_bias_add = skip_bias_add
        device = device if weight is None or device is not None else weight.device
        full = _full_weight(
            (in_features, out_features), weight, device, dtype, weight_initializer,
            in_features, out_features,
        )  # fmt: skip
        self.weight = place(full, self.weight.tp_spec, group, weight, device, dtype)
        if bias:
            if bias_ is None:
                b = torch.empty(out_features, device=device, dtype=dtype)
                initialize(b, in_features, out_features, bias_initializer, "bias")
            else:
                b = bias_
            self.bias = replicate(b, bias_, device, dtype)
            self.bias.tp_grad_reduced = shares

    @staticmethod
    def from_native_module(
        module: nn.Module, process_group: Any = None, **kwargs: Any
    ) -> nn.Module:
        n_in, n_out = _conv1d_sizes(module, "GPT2FusedLinearConv1D_Row")
        return GPT2FusedLinearConv1D_Row(
            n_in, n_out, bias=module.bias is not None, device=module.weight.device,
            process_group=comm_group(process_group, "GPT2FusedLinearConv1D_Row"),
            weight=module.weight, bias_=module.bias, **kwargs,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> Any:
        return row_forward(self, x)
