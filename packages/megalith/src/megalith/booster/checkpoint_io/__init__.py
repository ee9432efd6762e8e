"""Checkpoint I/O per plugin (plugin.get_checkpoint_io(), ColossalAI's shape).

    base.py             CheckpointIO: ColossalAI's methods and signatures over four hooks
    general.py          GeneralCheckpointIO: plain and DDP models (megalith_core's format only);
                        also on its own, on a plain module and torch optimizer
    zero.py             ZeroCheckpointIO (LowLevelZero/GeminiCheckpointIO): the ZeRO plugins
    hybrid.py           HybridParallelCheckpointIO: tensor-parallel and pipelined models
    moe.py              MoECheckpointIO: experts split over expert-parallel ranks
    tp_layout.py        ZeRO's file layout of tensor-parallel shards
    pipeline_stages.py  a pipelined model's stages collected for, and read back from, the files
    locations.py        ColossalAI's file-name prefix; the paths a load accepts
    safetensors_join.py one file from several without loading them (unsharded saves)
    async_writes.py     use_async: the writer thread and synchronize()
    hf_config.py        config.json / generation_config.json of transformers models
    lora.py             save_lora_as_pretrained: peft's adapter files
    index_file.py       CheckpointIndexFile: ColossalAI's view of an index json

Every one writes the same files, so a checkpoint moves between plugins, world sizes
and tp x pp x dp layouts.
"""

from .base import CheckpointIO
from .general import GeneralCheckpointIO
from .hybrid import HybridParallelCheckpointIO
from .index_file import CheckpointIndexFile
from .moe import MoECheckpointIO
from .zero import GeminiCheckpointIO, LowLevelZeroCheckpointIO, ZeroCheckpointIO

__all__ = [
    "CheckpointIO",
    "CheckpointIndexFile",
    "GeminiCheckpointIO",
    "GeneralCheckpointIO",
    "HybridParallelCheckpointIO",
    "LowLevelZeroCheckpointIO",
    "MoECheckpointIO",
    "ZeroCheckpointIO",
]
