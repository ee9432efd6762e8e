"""How the parameters ZeRO holds relate to the full tensors in checkpoint files.

The full checkpoints (save_full / load_full, save_full_optimizer /
load_full_optimizer) hold one whole tensor per parameter name. When the
parameters handed to ZeRO are themselves shards of larger tensors (tensor
parallelism: ZeRO then shards a shard over its dp group), the caller passes a
FileLayout that joins each tensor into the whole one on save (a collective over
its own group, called on every rank in the same order) and takes this rank's part
on load. The files stay the same, so they load under any layout. `file_name` maps
the name ZeRO knows a parameter by to its key in the optimizer files (a pipeline
stage's parameters go by their names in the whole model they were cut from).
"""

from __future__ import annotations

from typing import Any

import torch

import megalith_comm as comm


class FileLayout:
    """The identity: parameters are whole tensors; rank 0 of ZeRO's group writes."""

    def file_name(self, name: str) -> str:
        return name

    def full_numel(self, name: str, numel: int) -> int:
        return numel

    def full_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape)

    def to_full(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def to_local(self, name: str, full: torch.Tensor) -> torch.Tensor:
        return full

    def writes(self, group: Any) -> bool:
        return group.rank == 0

    def barrier(self, group: Any) -> None:
        comm.barrier(group=group)


IDENTITY = FileLayout()
