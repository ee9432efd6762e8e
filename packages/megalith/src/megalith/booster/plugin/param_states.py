"""An optimizer's per-parameter states following its parameters through boost().

boost() may be handed an optimizer that has already stepped (a resumed script, or
ColossalAI's tests boosting a reference model after training it): its states, step
counts and param-group hyperparameters must carry on as if nothing happened. The
plugins replace parameters as they shard the model (a tensor-parallel shard is a new
tensor) and keep only some of them (a pipeline stage's), so the states are re-keyed
as the parameters are:

- a parameter replaced by its tp shard: each state of the parameter's shape becomes
  the same shard of it (ShardSpec.take, as a checkpoint load does); other entries
  ("step") are kept;
- a parameter another pipeline stage holds: its state is dropped with it;
- ZeRO then moves the states it finds into its chunks' shards (megalith_zero.shard).
"""

from __future__ import annotations

from typing import Any

import torch


def follow_params(
    optimizer: torch.optim.Optimizer | None,
    model: torch.nn.Module,
    before: dict[int, str],
    tp: Any = None,
) -> None:
    """Points the optimizer at the model's parameters now, each by the name it had
    before (sharding keeps names), and moves each parameter's state onto its new
    tensor, sliced like it over the tp group `tp`."""
    if optimizer is None:
        return
    after = dict(model.named_parameters())
    for group in optimizer.param_groups:
        params = []
        for p in group["params"]:
            q = after[before[id(p)]] if id(p) in before else p
            entry = optimizer.state.pop(p, None)
            if entry:
                optimizer.state[q] = {k: _like(v, q, tp) for k, v in entry.items()}
            params.append(q)
        group["params"] = params


def _like(value: Any, new: torch.Tensor, tp: Any) -> Any:
    """A state of the full parameter's shape as the shard `new` of it (on its device)."""
    if not torch.is_tensor(value) or value.dim() == 0:
        return value
    ep = getattr(new, "ep_spec", None)
    if ep is not None and value.shape != new.shape:  # an expert weight: its experts' rows
        return ep.take(value, new.ep_group.rank, new.ep_group.size).to(new.device)
    spec = getattr(new, "tp_spec", None)
    if spec is not None and tp is not None and value.shape != new.shape:
        if tuple(value.shape) != tuple(spec.full_shape(new.shape)):
            raise ValueError(
                f"boost(): an optimizer state of shape {tuple(value.shape)} for a parameter "
                f"sharded to {tuple(new.shape)} from {tuple(spec.full_shape(new.shape))}: "
                "boost the optimizer that was built on this model's parameters"
            )
        value = spec.take(value, tp.rank, tp.size)
    return value.to(new.device)


def keep_states_of(optimizer: torch.optim.Optimizer | None, local: set[int]) -> None:
    """Drops the states of parameters this rank no longer holds (another stage's)."""
    if optimizer is None:
        return
    for p in [p for p in optimizer.state if id(p) not in local]:
        del optimizer.state[p]
