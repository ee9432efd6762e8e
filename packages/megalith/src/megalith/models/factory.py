"""megalith.models.create: a model from a preset name or a config, lazily or materialised."""

from __future__ import annotations

from typing import Any

import torch

from .base import CausalLM
from .config import GPTConfig, LlamaConfig, ModelConfig
from .gpt import GPTLMHeadModel
from .init import materialize
from .llama import LlamaForCausalLM
from .presets import get_config

MODEL_CLASSES: dict[type[ModelConfig], type[CausalLM]] = {
    GPTConfig: GPTLMHeadModel,
    LlamaConfig: LlamaForCausalLM,
}


def create(
    name_or_config: str | ModelConfig,
    device: torch.device | str = "meta",
    dtype: torch.dtype | None = None,
    seed: int = 0,
    activation_checkpointing: bool = False,
    **overrides: Any,
) -> CausalLM:
    """Builds a model from a preset name (see list_models()) or a GPTConfig / LlamaConfig.

    device="meta" (the default) allocates nothing: parameters have shapes and
    dtypes but no storage, for sizing, sharding or partitioning first; give them
    storage and values with materialize(model, device, seed). Any other device
    returns the model materialised there and initialised from `seed`.
    `overrides` replace config fields: create("gpt-tiny", vocab_size=256).
    """
    if isinstance(name_or_config, str):
        config = get_config(name_or_config, **overrides)
    elif isinstance(name_or_config, ModelConfig):
        config = name_or_config.replace(**overrides) if overrides else name_or_config
    else:
        raise TypeError(
            f"create() takes a model name or a ModelConfig, got {type(name_or_config).__name__}"
        )
    model_class = MODEL_CLASSES.get(type(config))
    if model_class is None:
        raise TypeError(f"no model class for {type(config).__name__}")
    # Built on meta always: nothing is allocated or initialised twice, and a model too
    # big for one device can still be inspected.
    with torch.device("meta"):
        model = model_class(config)
    if dtype is not None:
        model.to(dtype=dtype)
    if activation_checkpointing:
        model.set_activation_checkpointing(True)
    if torch.device(device).type != "meta":
        materialize(model, device=device, seed=seed)
    return model
