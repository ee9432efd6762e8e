"""Embedding1D (the embedding dimension split over ranks) and VocabParallelEmbedding1D
(the vocabulary split), ColossalAI's two tensor-parallel embeddings.

VocabParallelEmbedding1D pads the vocabulary to a multiple of
make_vocab_size_divisible_by * tp, as ColossalAI does; the padded rows are never looked
up, and state_dict() returns the table without them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...lazy import LazyInitContext
from ...tensor_parallel.embedding import VocabParallelEmbedding
from ...tensor_parallel.regions import gather_from_region
from ...tensor_parallel.shards import ShardSpec, check_divisible
from .groups import comm_group
from .options import check_common, initialize
from .parallel_module import ParallelModule, place


def _table(num: int, dim: int, weight, padding_idx, device, dtype, initializer) -> torch.Tensor:
    if weight is not None:
        return weight.detach()
    full = torch.empty(num, dim, device=device, dtype=dtype)
    initialize(full, num, dim, initializer, "embedding")
    if padding_idx is not None:
        with torch.no_grad():
            full[padding_idx].zero_()
    return full


def _native(module: nn.Module, what: str) -> None:
    LazyInitContext.materialize(module)
    if not isinstance(module, nn.Embedding):
        raise TypeError(
            f"{what}.from_native_module takes an nn.Embedding, got {type(module).__name__}"
        )


class Embedding1D(ParallelModule):
    """The table's columns (embedding_dim) split; gather_output all-gathers them."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        process_group: Any = None,
        gather_output: bool = True,
        weight: nn.Parameter | None = None,
        weight_initializer: Callable | None = None,
        fp8_communication: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        check_common("Embedding1D", fp8_communication, False, {})
        self.group = comm_group(process_group, "Embedding1D")
        check_divisible("the embedding dimension of Embedding1D", embedding_dim, self.group.size)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.gather_output = padding_idx, gather_output
        self.embed_args, self.embed_kwargs = args, kwargs  # F.embedding's own extras
        device = device if weight is None or device is not None else weight.device
        full = _table(
            num_embeddings, embedding_dim, weight, padding_idx, device, dtype, weight_initializer
        )
        self.weight = place(full, ShardSpec(1, (embedding_dim,)), self.group, weight, device, dtype)

    @staticmethod
    def from_native_module(
        module: nn.Embedding, process_group: Any = None, **kwargs: Any
    ) -> nn.Module:
        _native(module, "Embedding1D")
        return Embedding1D(
            module.num_embeddings, module.embedding_dim, module.padding_idx,
            device=module.weight.device, process_group=process_group, weight=module.weight,
            **kwargs,
        )  # fmt: skip

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = F.embedding(
            input_ids, self.weight, self.padding_idx, *self.embed_args, **self.embed_kwargs
        )
        return gather_from_region(out, self.group) if self.gather_output else out


class VocabParallelEmbedding1D(VocabParallelEmbedding, ParallelModule):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        process_group: Any = None,
        weight: nn.Parameter | None = None,
        weight_initializer: Callable | None = None,
        make_vocab_size_divisible_by: int = 64,
        fp8_communication: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        what = "VocabParallelEmbedding1D"
        check_common(what, fp8_communication, False, kwargs)
        group = comm_group(process_group, what)
        multiple = max(1, make_vocab_size_divisible_by) * group.size
        padded = -(-num_embeddings // multiple) * multiple
        super().__init__(padded, embedding_dim, group, padding_idx, False, "meta", dtype)
        self.old_num_embeddings = num_embeddings
        device = device if weight is None or device is not None else weight.device
        full = _table(
            num_embeddings, embedding_dim, weight, padding_idx, device, dtype, weight_initializer
        )
        if padded > num_embeddings:
            full = torch.cat([full, full.new_zeros(padded - num_embeddings, embedding_dim)])
        self.weight = place(full, ShardSpec(0, (padded,)), group, weight, device, dtype)
        self.num_embeddings_per_partition = padded // group.size
        self.vocab_start_index, self.vocab_end_index = self.start, self.end

    @staticmethod
    def from_native_module(
        module: nn.Embedding, process_group: Any = None, **kwargs: Any
    ) -> nn.Module:
        _native(module, "VocabParallelEmbedding1D")
        return VocabParallelEmbedding1D(
            module.num_embeddings, module.embedding_dim, module.padding_idx,
            device=module.weight.device, process_group=process_group, weight=module.weight,
            **kwargs,
        )  # fmt: skip

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if not keep_vars:
            destination[prefix + "weight"] = destination[prefix + "weight"][
                : self.old_num_embeddings
            ]

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        key = prefix + "weight"
        value = state_dict.get(key)
        if value is not None and value.shape[0] == self.old_num_embeddings < self.num_embeddings:
            pad = value.new_zeros(self.num_embeddings - self.old_num_embeddings, value.shape[1])
            state_dict[key] = torch.cat([value, pad])
        super()._load_from_state_dict(state_dict, prefix, *args)
