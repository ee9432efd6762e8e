"""ColossalAI's `colossalai.lazy`: build a model without allocating it, materialise later.

from megalith.lazy import LazyInitContext, is_lazy
with LazyInitContext():
    model = LlamaForCausalLM(config)        # meta tensors: ~0 bytes
if is_lazy(model):
    LazyInitContext.materialize(model)      # the values of eager construction

context.py     LazyInitContext, is_lazy
trace.py       the record of ops on meta tensors, and its replay
random_ops.py  the generator state before each random op, so a part replays alone
chunks.py      ChunkMaterializer: a few parameters at a time, as the ZeRO plugins shard
adapters.py    peft adapters on a lazy model (booster.enable_lora): real now, eager's values
tp_shards.py   shard_lazily: tensor-parallel shards cut from a lazy model, tensor by tensor
"""

from .chunks import ChunkMaterializer
from .context import LazyInitContext, LazyTensor, is_lazy, materialize_rest

__all__ = ["ChunkMaterializer", "LazyInitContext", "LazyTensor", "is_lazy", "materialize_rest"]
