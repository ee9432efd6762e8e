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

from megalith.booster.checkpoint_io import (
    CheckpointIndexFile,
    CheckpointIO,
    GeneralCheckpointIO,
    HybridParallelCheckpointIO,
    MoECheckpointIO,
)

__all__ = [
    "CheckpointIO",
    "CheckpointIndexFile",
    "GeneralCheckpointIO",
    "HybridParallelCheckpointIO",
    "MoECheckpointIO",
]
