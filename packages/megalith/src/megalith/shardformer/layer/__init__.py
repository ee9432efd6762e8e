"""ColossalAI's shardformer layers (`colossalai.shardformer.layer`) on megalith's
tensor-parallel layers. Each takes ColossalAI's arguments and has its
`from_native_module(module, process_group, ...)`; `process_group` may be a
torch.distributed group, a megalith_comm group, a one-element list, or None (the world).
"""

from .dropout import DropoutForParallelInput, DropoutForReplicatedInput
from .embedding import Embedding1D, VocabParallelEmbedding1D
from .linear import Linear1D_Col, Linear1D_Row, LinearWithGradAccum
from .normalization import BaseLayerNorm, FusedLayerNorm, FusedRMSNorm, LayerNorm, RMSNorm
from .parallel_module import ParallelModule
from .qkv_fused_linear import GPT2FusedLinearConv1D_Col, GPT2FusedLinearConv1D_Row
from .refused import refused_names

__all__ = [
    "BaseLayerNorm",
    "DropoutForParallelInput",
    "DropoutForReplicatedInput",
    "Embedding1D",
    "FusedLayerNorm",
    "FusedRMSNorm",
    "GPT2FusedLinearConv1D_Col",
    "GPT2FusedLinearConv1D_Row",
    "LayerNorm",
    "Linear1D_Col",
    "Linear1D_Row",
    "LinearWithGradAccum",
    "ParallelModule",
    "RMSNorm",
    "VocabParallelEmbedding1D",
]


def __getattr__(name: str):
    fix = refused_names().get(name)
    if fix is None:
        raise AttributeError(f"module 'megalith.shardformer.layer' has no attribute {name!r}")
    raise ImportError(f"megalith.shardformer.layer.{name} is not provided: {fix}")
