"""Checkpoint I/O per plugin (plugin.get_checkpoint_io(), ColossalAI's shape).

    base.py             CheckpointIO: ColossalAI's methods over four hooks
    general.py          GeneralCheckpointIO: plain and DDP models (megalith_core's format only)
    zero.py             ZeroCheckpointIO: LowLevelZero, Gemini, Hybrid's ZeRO without a pipeline
    hybrid.py           HybridParallelCheckpointIO: tensor-parallel and pipelined models
    tp_layout.py        ZeRO's file layout of tensor-parallel shards
    pipeline_stages.py  a pipelined model's stages collected for, and read back from, the files

Every one writes the same files, so a checkpoint moves between plugins, world sizes
and tp x pp x dp layouts.
"""

from .base import CheckpointIO
from .general import GeneralCheckpointIO
from .hybrid import HybridParallelCheckpointIO
from .zero import ZeroCheckpointIO

__all__ = ["CheckpointIO", "GeneralCheckpointIO", "HybridParallelCheckpointIO", "ZeroCheckpointIO"]
