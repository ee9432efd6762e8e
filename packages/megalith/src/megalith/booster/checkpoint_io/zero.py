"""ZeroCheckpointIO: LowLevelZeroPlugin, GeminiPlugin, and HybridParallelPlugin's ZeRO
without a pipeline.

megalith_zero's full checkpoints do the work: parameters and optimizer states are
gathered over ZeRO's group one chunk at a time and streamed into the files (never
the whole model in memory), and on loading each rank reads the slices its shards
hold. A FileLayout says how ZeRO's parameters relate to the files' tensors: whole
ones (the identity), or tensor-parallel shards (tp_layout.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..plugin.base import require
from .base import CheckpointIO
from .key_check import check_model_files


def _zero() -> Any:
    return require("megalith_zero", "megalith-zero", "ZeRO checkpoints")


class ZeroCheckpointIO(CheckpointIO):
    """layout_for(zero_model) gives the FileLayout of a model's parameters; None: they
    are whole tensors."""

    def __init__(self, layout_for: Callable[[Any], Any] | None = None) -> None:
        self.layout_for = layout_for

    def layout(self, zmodel: Any) -> Any:
        return self.layout_for(zmodel) if self.layout_for else _zero().file_layout.IDENTITY

    def write_model(self, model: Any, directory: Path, max_shard_bytes: int) -> None:
        zmodel = model.module
        _zero().save_full(zmodel, directory, max_shard_bytes, layout=self.layout(zmodel))

    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        """Every parameter must be in the files (strict or not): ZeRO's chunks are whole.
        The keys and shapes are checked on every rank first (key_check.py)."""
        zmodel = model.module
        layout = self.layout(zmodel)
        params = {
            s.name: layout.full_shape(s.name, s.shape) for c in zmodel.chunks for s in c.spec.slots
        }
        names = zmodel.module.state_dict(keep_vars=True).keys()
        buffers = {n: None for n, _ in zmodel.module.named_buffers() if n in names}
        check_model_files(
            directory,
            {**buffers, **params},
            strict=strict,
            known=names,
            required=params,
            what=type(zmodel.module).__name__,
            why_required="ZeRO's chunks are whole: every parameter must be in the files, "
            "strict=False or not",
        )
        _zero().load_full(zmodel, zmodel.optimizer, directory, layout=self.layout(zmodel))

    def write_optimizer(self, optimizer: Any, directory: Path, max_shard_bytes: int) -> None:
        zopt = optimizer.optim
        layout = self.layout(zopt.model)
        _zero().save_full_optimizer(zopt.model, zopt, directory, max_shard_bytes, layout=layout)

    def read_optimizer(self, optimizer: Any, directory: Path) -> None:
        """With the loss scale: megalith_zero's load_full_optimizer reads it."""
        zopt = optimizer.optim
        _zero().load_full_optimizer(zopt.model, zopt, directory, layout=self.layout(zopt.model))


class LowLevelZeroCheckpointIO(ZeroCheckpointIO):
    """ColossalAI's name for LowLevelZeroPlugin's I/O: ZeroCheckpointIO over whole tensors."""

    def __init__(self) -> None:
        super().__init__()


class GeminiCheckpointIO(ZeroCheckpointIO):
    """ColossalAI's name for GeminiPlugin's I/O: ZeroCheckpointIO over whole tensors."""

    def __init__(self) -> None:
        super().__init__()
