"""megalith.shardformer: ColossalAI's `colossalai.shardformer` names.

`layer` holds the parallel layers scripts and model zoos build by hand (Linear1D_Col,
Linear1D_Row, VocabParallelEmbedding1D, ...); ShardConfig / ShardFormer shard a whole
supported model with megalith's tensor-parallel policies.
"""

from . import layer
from .shard import (
    GradientCheckpointConfig,
    PipelineGradientCheckpointConfig,
    ShardConfig,
    ShardFormer,
)

__all__ = [
    "GradientCheckpointConfig",
    "PipelineGradientCheckpointConfig",
    "ShardConfig",
    "ShardFormer",
    "layer",
]
