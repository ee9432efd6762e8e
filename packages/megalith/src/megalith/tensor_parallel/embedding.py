"""VocabParallelEmbedding: the embedding table's rows (the vocabulary) split over ranks.

Each rank looks up the ids in its range [start, end), writes zeros for the others,
and the partial results are summed (all-reduce; reduce-scatter along the sequence
when its output feeds sequence-parallel layers directly).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megalith_comm import ProcessGroup

from .regions import reduce_from_region, seq_reduce_scatter
from .shards import ShardSpec, check_divisible, shard_parameter


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        group: ProcessGroup,
        padding_idx: int | None = None,
        sequence_parallel: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        local = check_divisible("the vocabulary size", num_embeddings, group.size)
        self.group = group
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.start, self.end = group.rank * local, (group.rank + 1) * local
        self.padding_idx = padding_idx
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(torch.empty(local, embedding_dim, device=device, dtype=dtype))
        self.weight.tp_spec = ShardSpec(0, (num_embeddings,))

    @classmethod
    def from_embedding(
        cls, module: nn.Embedding, group: ProcessGroup, sequence_parallel: bool = False
    ) -> VocabParallelEmbedding:
        n, d = module.weight.shape
        layer = cls(n, d, group, module.padding_idx, sequence_parallel, "meta", module.weight.dtype)
        layer.weight = shard_parameter(
            module.weight, layer.weight.tp_spec, group.rank, group.size, "the vocabulary size"
        )
        return layer

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        outside = (input_ids < self.start) | (input_ids >= self.end)
        local_ids = (input_ids - self.start).masked_fill(outside, 0)
        pad = self.padding_idx
        local_pad = pad - self.start if pad is not None and self.start <= pad < self.end else None
        out = F.embedding(local_ids, self.weight, padding_idx=local_pad)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return seq_reduce_scatter(out, self.group)
        return reduce_from_region(out, self.group)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows {self.start}:{self.end}"
