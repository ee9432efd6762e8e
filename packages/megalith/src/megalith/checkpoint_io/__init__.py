"""ColossalAI's `colossalai.checkpoint_io`: the checkpoint I/O classes, usable on their own.

    from megalith.checkpoint_io import GeneralCheckpointIO
    io = GeneralCheckpointIO()                  # no Booster, no process group
    io.save_model(model, "ckpt/model", shard=True, size_per_shard=10)
    io.save_optimizer(optimizer, "ckpt/optim.safetensors")
    io.load_model(new_model, "ckpt/model")

The classes are the plugins' own (megalith.booster.checkpoint_io); every one writes
safetensors files with a transformers-readable index, and nothing is pickled.
"""

from __future__ import annotations

from typing import Any

from megalith.booster.checkpoint_io import (
    CheckpointIndexFile,
    CheckpointIO,
    GeneralCheckpointIO,
    HybridParallelCheckpointIO,
)


class MoECheckpointIO:
    """Refused: megalith has no mixture-of-experts plugin."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "MoECheckpointIO: megalith has no MoE plugin (ColossalAI's "
            "MoeHybridParallelPlugin); train with HybridParallelPlugin, whose I/O is "
            "HybridParallelCheckpointIO (booster.checkpoint_io)"
        )


__all__ = [
    "CheckpointIO",
    "CheckpointIndexFile",
    "GeneralCheckpointIO",
    "HybridParallelCheckpointIO",
    "MoECheckpointIO",
]
