"""Activation (gradient) checkpointing for HybridParallelPlugin's `gradient_checkpoint_config`.

The layers of the user's model recompute their activations in backward instead of
storing them (torch.utils.checkpoint, non-reentrant, so tensor-parallel collectives
inside a layer simply run again on every rank of the group). ColossalAI's meaning
of the ratio: the first ceil(ratio * layers) layers are checkpointed, the rest keep
their activations (they trade memory for the recompute time they save).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class GradientCheckpointConfig:
    """gradient_checkpointing_ratio: the fraction of the model's layers checkpointed (0, 1]."""

    gradient_checkpointing_ratio: float = 1.0

    def __post_init__(self) -> None:
        r = self.gradient_checkpointing_ratio
        if not 0.0 < r <= 1.0:
            raise ValueError(
                f"GradientCheckpointConfig: gradient_checkpointing_ratio={r}; a fraction of "
                "the layers in (0, 1] (leave gradient_checkpoint_config=None for none)"
            )


def checkpoint_config(value: Any) -> GradientCheckpointConfig | None:
    """None/False: off; True: every layer; a config (ours or any object with a
    gradient_checkpointing_ratio, as ColossalAI's) or a float ratio."""
    if value is None or value is False:
        return None
    if value is True:
        return GradientCheckpointConfig()
    if isinstance(value, (int, float)):
        return GradientCheckpointConfig(float(value))
    ratio = getattr(value, "gradient_checkpointing_ratio", None)
    if ratio is None:
        raise TypeError(
            f"gradient_checkpoint_config={value!r}; expected None, True, a ratio in (0, 1] or "
            "megalith.booster.GradientCheckpointConfig(gradient_checkpointing_ratio=...)"
        )
    return GradientCheckpointConfig(float(ratio))


def apply_checkpointing(model: torch.nn.Module, config: GradientCheckpointConfig) -> int:
    """Turns checkpointing on for the first layers of `model`; returns how many."""
    if hasattr(model, "set_activation_checkpointing") and hasattr(model, "blocks"):
        n = len(model.blocks)  # megalith.models
        k = math.ceil(config.gradient_checkpointing_ratio * n)
        model.set_activation_checkpointing(False)
        model.set_activation_checkpointing(True, list(range(k)))
        return k
    enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
        model, "gradient_checkpointing_enable", None
    )
    if enable is None:
        raise ValueError(
            f"gradient_checkpoint_config: {type(model).__name__} has no checkpointing switch; "
            "supported: megalith.models and transformers models (PreTrainedModel); or "
            "checkpoint your layers yourself (torch.utils.checkpoint) and leave it None"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated alias, where it is all
        enable({"use_reentrant": False})
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    k = math.ceil(config.gradient_checkpointing_ratio * len(layers))
    for layer in layers[k:]:
        layer.gradient_checkpointing = False
    return k
