"""Deterministic initialisation, and materialising a model built on the meta device.

Each parameter draws from its own generator, seeded from (seed, its name in the
model). So its starting values do not depend on which other parameters were
initialised before it, on this rank or any other: a pipeline stage or a ZeRO-3
rank that materialises only its own part gets the same numbers as a
single-process run of the whole model. Values are drawn in fp32 on the CPU and
then cast and copied, so they are also the same on every device and thread count.
"""

from __future__ import annotations

import hashlib

import torch

from .base import CausalLM


def parameter_seed(seed: int, name: str) -> int:
    """The generator seed of the parameter `name` (its model-level name) under `seed`."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@torch.no_grad()
def init_weights(model: CausalLM, seed: int = 0) -> None:
    """Initialises every parameter of `model` that is not on the meta device.

    Parameters still on meta are skipped, so a caller that materialised only
    some submodules (`submodule.to_empty(device=...)`) initialises just those.
    The rule per parameter is model.init_rule(name): GPT-2's N(0, 0.02) with
    residual projections scaled by 1/sqrt(2 * n_layers), or Llama's N(0, 0.02)
    for every Linear and the embedding; norms start at one, biases at zero.
    """
    for name, param in model.named_parameters():
        if param.is_meta:
            continue
        # A tied copy held apart (the last pipeline stage's lm_head) takes its source's
        # name, so both copies start equal.
        name = model.tied_weights.get(name, name)
        kind, std = model.init_rule(name)
        if kind == "ones":
            param.fill_(1.0)
        elif kind == "zeros":
            param.zero_()
        elif kind == "normal":
            generator = torch.Generator(device="cpu").manual_seed(parameter_seed(seed, name))
            values = torch.empty(param.shape, dtype=torch.float32)
            values.normal_(0.0, std, generator=generator)
            param.copy_(values)
        else:
            raise ValueError(f"{type(model).__name__}.init_rule({name!r}) gave unknown {kind!r}")


def materialize(
    model: CausalLM,
    device: torch.device | str = "cpu",
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> CausalLM:
    """Gives a meta-device model real storage on `device` and initialises it from `seed`.

    Returns the same model object. The same seed gives the same values whatever
    the device, dtype aside.
    """
    model.to_empty(device=device)
    # to_empty swaps in new Parameter objects, one per module, which unties shared weights.
    model.tie_weights()
    if dtype is not None:
        model.to(dtype=dtype)
    init_weights(model, seed)
    return model
