"""Sharded materialisation: a model built on the meta device, sharded, then given storage
shard by shard, so the whole model never exists on one rank.

    model = megalith.models.create("llama-7b")            # meta: no memory
    shard_model(model, tp_group)                           # meta shards
    materialize_sharded(model, "cuda", seed=0)             # this rank's values only

Each parameter is drawn whole on the CPU from its own seeded generator (as
megalith.models.init does) and cut to this rank's shard, so the values equal the
unsharded model's; the peak is one full parameter, not the model.
"""

from __future__ import annotations

import torch
from torch import nn

from .sequence import add_grad_all_reduce

_ATTRS = ("tp_spec", "tp_grad_reduced")


@torch.no_grad()
def materialize_sharded(
    model: nn.Module, device: torch.device | str = "cpu", seed: int = 0
) -> nn.Module:
    """Gives every meta parameter of a sharded megalith.models model storage and values.

    The model needs init_rule(name) (megalith.models' CausalLM); tied parameters stay tied.
    """
    from megalith.models.init import parameter_seed

    group = model.tp_info.group
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    names: dict[int, str] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for attr, p in mod._parameters.items():
            if p is None or not p.is_meta:
                continue
            owners.setdefault(id(p), []).append((mod, attr))
            names.setdefault(id(p), f"{mod_name}.{attr}" if mod_name else attr)
    for key, places in owners.items():
        mod, attr = places[0]
        old = mod._parameters[attr]
        name = model.tied_weights.get(names[key], names[key])
        spec = getattr(old, "tp_spec", None)
        full_shape = spec.full_shape(old.shape) if spec else tuple(old.shape)
        kind, std = model.init_rule(name)
        values = torch.empty(full_shape, dtype=torch.float32)
        if kind == "ones":
            values.fill_(1.0)
        elif kind == "zeros":
            values.zero_()
        else:
            gen = torch.Generator(device="cpu").manual_seed(parameter_seed(seed, name))
            values.normal_(0.0, std, generator=gen)
        if spec is not None:
            values = spec.take(values, group.rank, group.size)
        new = nn.Parameter(values.to(device=device, dtype=old.dtype), old.requires_grad)
        for a in _ATTRS:
            if hasattr(old, a):
                setattr(new, a, getattr(old, a))
        if hasattr(old, "tp_grad_hook_group"):
            add_grad_all_reduce(new, old.tp_grad_hook_group)
        for m, a in places:
            m._parameters[a] = new
    return model
