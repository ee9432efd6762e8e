"""estimate(): where ZeRO (and its offloading) would put a model's training state, per
rank, without allocating any of it or running a collective: the chunks per tier and the
bytes on the device, in host memory and on NVMe. The model may live on the meta device,
so a 20B model is planned in a second on a laptop. `megalith plan` prints it.

Device bytes are the model state: working parameters, gradients (with the largest
chunk's gradients in flight while they reduce), at stage 3 the largest gathered chunk,
and the masters and optimizer states kept there. Activations, temporaries and the
allocator's slack come on top; placement="auto" measures them in its warm-up step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from megalith_core.optim import flat_states
from megalith_core.optim.rules import rule_for

from .api import _param_groups
from .config import ZeroConfig
from .layout import layout_for
from .offload import chunk_costs, require_offload, resident_state, warmup_param_frac


@dataclass(frozen=True)
class Estimate:
    params: int  # parameters of the model
    chunks: int  # layout chunks (trainable and frozen)
    chunk_bytes: int  # the largest chunk's working parameters, gathered
    tiers: dict[str, int]  # trainable chunks per tier of their masters and states
    device: dict[str, int] = field(default_factory=dict)  # bytes per kind, per rank
    host_bytes: int = 0  # per rank
    nvme_bytes: int = 0  # per rank

    @property
    def device_bytes(self) -> int:
        return sum(self.device.values())


def estimate(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: ZeroConfig, world: int
) -> Estimate:
    """The model state's bytes per rank under `config` at `world` ranks (see the module's
    docstring). With placement="auto" the plan is the warm-up's (everything offloaded)."""
    params = _param_groups(model, optimizer)
    wd = torch.empty((), dtype=config.param_dtype).element_size()
    layout = layout_for(
        params, world, config.chunk_bytes, config.param_dtype, config.shard_each_param
    )
    rule = rule_for(optimizer)
    n_params = sum(p.numel() for _, p, _ in params)
    chunk_bytes = max(c.numel for c in layout.chunks) * wd
    trainable = sum(c.group >= 0 for c in layout.chunks)
    if config.offload is None:
        mixed = int(config.param_dtype != torch.float32)
        states = 0
        for c in layout.chunks:
            if c.group >= 0:  # lean states (the group's state_dtype) at their real bytes
                g = optimizer.param_groups[c.group]
                fmt = flat_states.group_format(rule, g)
                states += flat_states.nbytes(rule.state_names(g), fmt, c.shard_numel)
                states += 4 * c.shard_numel * mixed
        p, g, f, q, _, _ = resident_state(config, layout, lambda spec: False)
        device = {"params": p, "grads": g, "grads_in_flight": f, "gathered": q}
        return Estimate(
            n_params,
            len(layout.chunks),
            chunk_bytes,
            {"device": trainable},
            {**device, "masters_and_states": states},
        )
    mo = require_offload()
    costs = chunk_costs(config, layout, optimizer, rule)
    p_ = mo.plan(list(costs.values()), config.offload, warmup_param_frac(config))
    off = {k for k, i in zip(costs, p_.params_on_host) if i}
    off |= {k for k, i in zip(costs, p_.params_on_nvme) if i}
    p, g, f, q, _, _ = resident_state(config, layout, lambda spec: spec.index in off)
    device = {"params": p, "grads": g, "grads_in_flight": f, "gathered": q}
    device["masters_and_states"] = p_.device_bytes
    tiers = {t: p_.tiers.count(t) for t in ("device", "host", "nvme") if t in p_.tiers}
    return Estimate(
        n_params, len(layout.chunks), chunk_bytes, tiers, device, p_.host_bytes, p_.nvme_bytes
    )
