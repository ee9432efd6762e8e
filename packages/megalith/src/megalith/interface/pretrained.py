"""Where a model was loaded from (ColossalAI's get_pretrained_path/set_pretrained_path)."""

from __future__ import annotations

import torch


def get_pretrained_path(model: torch.nn.Module) -> str | None:
    """The path set_pretrained_path recorded on the model, or None."""
    return getattr(model, "_pretrained", None)


def set_pretrained_path(model: torch.nn.Module, path: str) -> None:
    model._pretrained = path
