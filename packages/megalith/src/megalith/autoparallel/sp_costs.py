"""What all_to_all sequence parallelism (Ulysses, tensor_parallel/ulysses.py) adds to a
micro-batch, from the traced graph.

Every rank of an sp group holds the whole model and seq / sp of each sequence between
the first layer and the last; the embedding and the head run on the whole sequence.

- Attention: q, k and v go through one all-to-all each (sequence shards -> head
  shards) and the output through one back, ULYSSES_ALL_TO_ALLS a layer; backward runs
  the same four on the gradients, a checkpointed layer's recompute four more. A rank's
  buffer of each is its sequence shard of its tp shard of the heads:
  BlockCost.attention_io_bytes x micro-batch / (sp x tp) for the four together.
- The span: the hidden states are split before the first layer (backward: an
  all-gather of their gradient) and all-gathered after the last (forward).
- Gradients: every parameter of the layers saw only this rank's tokens, so a hook
  all-reduces each one's gradient over the sp group as backward makes it, once per
  micro-batch (reduce_partial_grads); blocking, one collective per parameter tensor.

Every one of these collectives blocks its rank mid-compute, as tp's all-reduces do, so
each also waits `sync_s` for its group's slowest member (cost.TP_SYNC_S: ranks that
share cores meet a partner that is descheduled).
"""

from __future__ import annotations

from .collectives import collective_time
from .knobs import Knobs
from .types import BlockCost, Cluster

#: all-to-alls of one layer's forward: q, k, v in, the attention output back
ULYSSES_ALL_TO_ALLS = 4


def ulysses_bytes(block: BlockCost, k: Knobs) -> float:
    """Bytes of one rank's buffers in a layer's forward all-to-alls, the four together.
    A block traced without fused attention counts q, k, v and the output as four
    tensors of its output's size (hidden = heads x head_dim)."""
    io = block.attention_io_bytes or ULYSSES_ALL_TO_ALLS * block.boundary_bytes
    return io * k.micro_batch / (k.sp * k.tp)


def ulysses_pass_s(cluster: Cluster, block: BlockCost, k: Knobs, sync_s: float = 0.0) -> float:
    """Seconds of one pass's (forward's or backward's) all-to-alls of a layer."""
    if k.sp == 1:
        return 0.0
    one = ulysses_bytes(block, k) / ULYSSES_ALL_TO_ALLS
    return ULYSSES_ALL_TO_ALLS * (collective_time(cluster, "all_to_all", k.sp, one, k.tp) + sync_s)


def span_gather_s(cluster: Cluster, block: BlockCost, k: Knobs, sync_s: float = 0.0) -> float:
    """Seconds of the span's one all-gather of a micro-batch's hidden states (the
    gathered buffer: the block's output on the whole sequence, whole over tp)."""
    if k.sp == 1:
        return 0.0
    nbytes = block.boundary_bytes * k.micro_batch
    return collective_time(cluster, "all_gather", k.sp, nbytes, k.tp) + sync_s


def grad_reduce_s(
    cluster: Cluster, block: BlockCost, k: Knobs, working_bytes: int, sync_s: float = 0.0
) -> float:
    """Seconds of one backward's gradient all-reduces of a layer over the sp group: one
    per parameter tensor (at least one), the rank's tp shard of its parameters."""
    if k.sp == 1 or block.params == 0:
        return 0.0
    n = block.params - block.tp_params + block.tp_params // k.tp
    calls = max(1, block.param_tensors)
    one = n * working_bytes / calls
    return calls * (collective_time(cluster, "all_reduce", k.sp, one, k.tp) + sync_s)
