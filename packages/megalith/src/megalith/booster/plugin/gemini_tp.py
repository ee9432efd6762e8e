"""GeminiPlugin(tp_size > 1): tensor parallelism over tp, ZeRO stage 3 over the rest.

HybridParallelPlugin's composition (its steps 3 and 5) with ZeRO at stage 3, in this
fixed order:
  1. the model's tensor-parallel policy (megalith.tensor_parallel), and every size it
     splits checked against tp, before any collective: a bad tp fails on every rank;
  2. a mesh (dp, tp) over the world, tp fastest (a model's shards on neighbouring
     ranks, on one host), dp = world / tp;
  3. the model sharded in place over tp, the logits gathered whole (the outputs are
     the tp = 1 model's);
  4. the optimizer re-pointed at the shards, by name; the tp ranks take tp rank 0's
     random state, so dropout masks agree across the shards of one activation;
  5. (the caller) megalith_zero.shard at stage 3 over the mesh's dp axis, told of the
     tp ranks (ModelParallel: a shard counts on its rank, a replicated parameter on tp
     rank 0 only) so the clipping norm and fp16 overflow check span the whole model.
ColossalAI's extra_dp_size replicates ZeRO's shards over a further axis; megalith
shards over all world / tp data-parallel ranks, which gives the same numbers.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import world
from .hybrid import _replace_params, _share_rng


def check_sizes(tp_size: int, extra_dp_size: int, world_size: int) -> None:
    if world_size % (tp_size * extra_dp_size):
        raise ValueError(
            f"GeminiPlugin: tp_size({tp_size}) * extra_dp_size({extra_dp_size}) = "
            f"{tp_size * extra_dp_size} does not divide the world size {world_size}: pick "
            "sizes whose product divides it"
        )


def shard_tensor_parallel(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, tp_size: int, extra_dp_size: int
) -> tuple[Any, Any]:
    """Steps 1-4 on the model (on the rank's device); returns (mesh, ModelParallel)."""
    import megalith_comm as comm
    import megalith_zero as zero
    from megalith.tensor_parallel import policy_for, shard_model

    w = world()
    check_sizes(tp_size, extra_dp_size, w.world_size)
    try:
        policy = policy_for(model)
    except ValueError as e:
        # ColossalAI's shardformer raises NotImplementedError for a model it has no
        # policy for; its scripts catch that type.
        raise NotImplementedError(
            f"GeminiPlugin(tp_size={tp_size}): {e}; or pass tp_size=1 (ZeRO-3 alone)"
        ) from None
    policy.validate(model, tp_size)
    mesh = comm.Mesh(w, dp=w.world_size // tp_size, tp=tp_size, name="gemini")
    before = {id(p): name for name, p in model.named_parameters()}
    shard_model(model, mesh.group("tp"), gather_logits=True, policy=policy)
    _replace_params(optimizer, model, before, mesh.group("tp"))  # states follow the shards
    _share_rng(mesh.group("tp"))
    first_tp = mesh.coord("tp") == 0

    def weight(p: torch.nn.Parameter) -> float:
        return 1.0 if first_tp or hasattr(p, "tp_spec") else 0.0

    return mesh, zero.ModelParallel(mesh.group("tp"), weight)
