"""The file layout of a tensor-parallel model under ZeRO (megalith_zero.FileLayout).

HybridParallelPlugin(zero_stage=1 or 2) hands megalith_zero a model whose
parameters are already tp shards, so a ZeRO chunk holds dp shards of tp shards.
megalith_zero's full checkpoints then write through this layout: on save each
parameter (and optimizer state), gathered over dp one chunk at a time, is
all-gathered over tp and joined by its tp_spec, and world rank 0 writes; on load
every rank takes its tp shard of each full tensor (ShardSpec.take) before ZeRO
copies its dp slice. The files are those of any other plugin, never the whole
model in memory at once.
"""

from __future__ import annotations

from typing import Any

import torch

from ..plugin.base import require, world


def tp_layout(zmodel: Any, tp: Any = None, file_names: dict[str, str] | None = None) -> Any:
    """A megalith_zero.FileLayout for zmodel's tp shards over tp (default: the model's
    tp group); file_names maps ZeRO's parameter names to the files' (a pipeline stage's
    names to the whole model's: pipeline_stages.stage_file_names)."""
    zero = require("megalith_zero", "megalith-zero", "reading and writing megalith checkpoints")

    class TensorParallelLayout(zero.FileLayout):
        def __init__(self) -> None:
            raw = zmodel.module
            state = raw.state_dict(keep_vars=True)
            self.specs = {n: getattr(t, "tp_spec", None) for n, t in state.items()}
            self.tp = tp if tp is not None else raw.tp_info.group
            self.names = file_names or {}

        def file_name(self, name: str) -> str:
            return self.names.get(name, name)

        def full_numel(self, name: str, numel: int) -> int:
            return numel * (self.tp.size if self.specs.get(name) is not None else 1)

        def full_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
            spec = self.specs.get(name)
            return tuple(spec.full_shape(shape)) if spec is not None else tuple(shape)

        def to_full(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
            from megalith.tensor_parallel.state import gather_full

            return gather_full(tensor, self.tp, self.specs.get(name))

        def to_local(self, name: str, full: torch.Tensor) -> torch.Tensor:
            spec = self.specs.get(name)
            return spec.take(full, self.tp.rank, self.tp.size) if spec is not None else full

        def writes(self, group: Any) -> bool:
            return world().rank == 0

        def barrier(self, group: Any) -> None:
            import megalith_comm as comm

            comm.barrier()  # the world's: every rank took part in the tp gathers

    return TensorParallelLayout()
