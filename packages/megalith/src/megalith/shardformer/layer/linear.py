"""Linear1D_Col, Linear1D_Row (and LinearWithGradAccum): ColossalAI's 1D tensor-parallel
linears, on megalith's ColumnParallelLinear / RowParallelLinear.

Their arguments are ColossalAI's: `weight` / `bias_` hand over the full tensors of an
existing layer (from_native_module does), `seq_parallel_mode` "split_gather" (or "ring")
all-gathers the sequence before a column linear and reduce-scatters it after a row
linear along `seq_parallel_dim`, and `skip_bias_add` returns (output, bias) for the
caller to fuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...lazy import LazyInitContext
from ...tensor_parallel.linear import ColumnParallelLinear, RowParallelLinear, _weight
from ...tensor_parallel.regions import (
    copy_to_region,
    gather_from_region,
    reduce_from_region,
    scatter_to_region,
    seq_all_gather,
    seq_reduce_scatter,
)
from .groups import comm_group
from .options import check_common, initialize, sequence_shares_tp
from .parallel_module import ParallelModule, place, replicate


def _full_weight(shape, weight, device, dtype, initializer, fan_in, fan_out) -> torch.Tensor:
    if weight is not None:
        return weight.detach()
    # Every rank draws the full tensor from the same generator state and keeps its
    # shard, so the layer equals a single-process one built under the same seed.
    full = torch.empty(shape, device=device, dtype=dtype)
    initialize(full, fan_in, fan_out, initializer, "linear")
    return full


def _check_bias_args(what: str, bias: bool, weight: Any, bias_: Any, skip_bias_add: bool) -> None:
    if skip_bias_add and not bias:
        raise ValueError(f"{what}: skip_bias_add=True needs bias=True")
    if weight is not None and bias and bias_ is None:
        raise ValueError(f"{what}: bias=True with a given weight needs bias_ (the bias tensor)")
    if weight is None and bias_ is not None:
        raise ValueError(f"{what}: bias_ is given without weight; pass both or neither")


def _native(module: nn.Module, process_group: Any, what: str) -> tuple[Any, int, int]:
    LazyInitContext.materialize(module)
    if not isinstance(module, nn.Linear):
        raise TypeError(
            f"{what}.from_native_module takes an nn.Linear, got {type(module).__name__}"
        )
    return comm_group(process_group, what), module.in_features, module.out_features


def row_forward(layer: RowParallelLinear, x: torch.Tensor) -> Any:
    """A row-parallel forward that can hand the bias back (skip_bias_add)."""
    if not layer.input_is_parallel:
        x = scatter_to_region(x, layer.group)
    y = F.linear(x, _weight(layer.weight, layer.transposed))
    if layer.sequence_parallel:
        y = seq_reduce_scatter(y, layer.group, dim=getattr(layer, "seq_parallel_dim", 1))
        bias = None if layer.bias is None else copy_to_region(layer.bias, layer.group)
    else:
        y = reduce_from_region(y, layer.group)
        bias = layer.bias
    if getattr(layer, "skip_bias_add", False):
        return y, bias
    return y if bias is None else y + bias


class Linear1D_Col(ColumnParallelLinear, ParallelModule):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        process_group: Any = None,
        gather_output: bool = False,
        seq_parallel_mode: str | None = None,
        seq_parallel_dim: int = 1,
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
        group = comm_group(process_group, what)
        shares = sequence_shares_tp(seq_parallel_mode, what)
        super().__init__(
            in_features, out_features, group, bias=bias, gather_output=gather_output,
            sequence_parallel=shares, device="meta", dtype=dtype,
        )  # fmt: skip
        self.seq_parallel_mode, self.seq_parallel_dim = seq_parallel_mode, seq_parallel_dim
        self.skip_bias_add = skip_bias_add
        device = device if weight is None or device is not None else weight.device
        full = _full_weight(
            (out_features, in_features), weight, device, dtype, weight_initializer,
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
        module: nn.Linear, process_group: Any = None, **kwargs: Any
    ) -> nn.Module:
        group, n_in, n_out = _native(module, process_group, "Linear1D_Col")
        if n_out < group.size:
            return module
        if n_out % group.size:
            raise ValueError(
                f"Linear1D_Col: out_features ({n_out}) is not a multiple of the tensor-parallel "
                f"size ({group.size}); choose a tp size that divides {n_out}"
            )
        return Linear1D_Col(
            n_in, n_out, bias=module.bias is not None, device=module.weight.device,
            process_group=group, weight=module.weight, bias_=module.bias, **kwargs,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> Any:
        if self.sequence_parallel:
            x = seq_all_gather(x, self.group, dim=self.seq_parallel_dim)
        else:
            x = copy_to_region(x, self.group)
        y = F.linear(x, self.weight, None if self.skip_bias_add else self.bias)
        if self.gather_output:
            y = gather_from_region(y, self.group)
        return (y, self.bias) if self.skip_bias_add else y


class Linear1D_Row(RowParallelLinear, ParallelModule):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        process_group: Any = None,
        seq_parallel_mode: str | None = None,
        seq_parallel_dim: int = 1,
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
            sequence_parallel=shares, device="meta", dtype=dtype,
        )  # fmt: skip
        self.parallel_input = parallel_input
        self.seq_parallel_mode, self.seq_parallel_dim = seq_parallel_mode, seq_parallel_dim
        self.skip_bias_add = skip_bias_add
        self.num_partitions = group.size
        device = device if weight is None or device is not None else weight.device
        full = _full_weight(
            (out_features, in_features), weight, device, dtype, weight_initializer,
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
        module: nn.Linear, process_group: Any = None, **kwargs: Any
    ) -> nn.Module:
        group, n_in, n_out = _native(module, process_group, "Linear1D_Row")
        if n_in < group.size:
            return module
        if n_in % group.size:
            raise ValueError(
                f"Linear1D_Row: in_features ({n_in}) is not a multiple of the tensor-parallel "
                f"size ({group.size}); choose a tp size that divides {n_in}"
            )
        return Linear1D_Row(
            n_in, n_out, bias=module.bias is not None, device=module.weight.device,
            process_group=group, weight=module.weight, bias_=module.bias, **kwargs,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> Any:
        return row_forward(self, x)


class LinearWithGradAccum(nn.Linear, ParallelModule):
    """ColossalAI's linear without parallelism (its gradient-accumulation fusion is a
    kernel detail): an nn.Linear with `skip_bias_add`."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        skip_bias_add: bool = False,
        weight: nn.Parameter | None = None,
        bias_: nn.Parameter | None = None,
        weight_initializer: Callable | None = None,
        bias_initializer: Callable | None = None,
        use_zbv: bool = False,
        **kwargs: Any,
    ) -> None:
        _check_bias_args("LinearWithGradAccum", bias, weight, bias_, skip_bias_add)
        check_common("LinearWithGradAccum", False, use_zbv, kwargs)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.skip_bias_add = skip_bias_add
        if weight is not None:
            self.weight = replicate(weight, weight, device, dtype)
            if bias:
                self.bias = replicate(bias_, bias_, device, dtype)
        else:
            initialize(self.weight, in_features, out_features, weight_initializer, "linear")
            if bias:
                initialize(self.bias, in_features, out_features, bias_initializer, "bias")

    @staticmethod
    def from_native_module(
        module: nn.Linear, process_group: Any = None, **kwargs: Any
    ) -> nn.Module:
        LazyInitContext.materialize(module)
        return LinearWithGradAccum(
            module.in_features, module.out_features, bias=module.bias is not None,
            device=module.weight.device, weight=module.weight, bias_=module.bias, **kwargs,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> Any:
        if self.skip_bias_add:
            return F.linear(x, self.weight), self.bias
        return super().forward(x)
