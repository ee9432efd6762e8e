"""Tensor and sequence parallelism over a megalith_comm ProcessGroup.

Layers (communication written once, in regions.py, as autograd Functions):
    ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
    vocab_parallel_cross_entropy / vocab_parallel_causal_lm_loss (never gathers
    the logits), HeadSplit (query and grouped kv heads over ranks).

Models:
    mesh = megalith_comm.Mesh(world, dp=2, tp=2)
    shard_model(model, mesh.group("tp"), sequence_parallel=True)   # in place
    materialize_sharded(model, device, seed)  # after sharding a meta model
    full_state_dict(model)   # the unsharded weights, transformers' names
    load_full_state_dict(model, state)   # back, from a checkpoint of any tp size

Supported models: see policies.SUPPORTED; a Policy subclass covers others.
All-to-all (Ulysses) sequence parallelism: apply_ulysses(model, sp_group), for
megalith.models decoders (ulysses.py).
"""

from .cross_entropy import vocab_parallel_causal_lm_loss, vocab_parallel_cross_entropy
from .embedding import VocabParallelEmbedding
from .heads import HeadSplit
from .linear import ColumnParallelLinear, HeadRowsLinear, RowParallelLinear
from .materialize import materialize_sharded
from .policies import (
    SUPPORTED,
    DecoderPolicy,
    Policy,
    ShardContext,
    TPInfo,
    install_parallel_loss,
    policy_for,
    shard_model,
)
from .regions import (
    copy_to_region,
    gather_from_region,
    reduce_from_region,
    scatter_to_region,
    seq_all_gather,
    seq_gather,
    seq_reduce_scatter,
    seq_split,
)
from .shards import ShardSpec, check_divisible
from .state import full_state_dict, gather_full, load_full_state_dict
from .ulysses import apply_ulysses

__all__ = [
    "SUPPORTED",
    "ColumnParallelLinear",
    "DecoderPolicy",
    "HeadRowsLinear",
    "HeadSplit",
    "Policy",
    "RowParallelLinear",
    "ShardContext",
    "ShardSpec",
    "TPInfo",
    "VocabParallelEmbedding",
    "apply_ulysses",
    "check_divisible",
    "copy_to_region",
    "full_state_dict",
    "gather_from_region",
    "gather_full",
    "install_parallel_loss",
    "load_full_state_dict",
    "materialize_sharded",
    "policy_for",
    "reduce_from_region",
    "scatter_to_region",
    "seq_all_gather",
    "seq_gather",
    "seq_reduce_scatter",
    "seq_split",
    "shard_model",
    "vocab_parallel_causal_lm_loss",
    "vocab_parallel_cross_entropy",
]
