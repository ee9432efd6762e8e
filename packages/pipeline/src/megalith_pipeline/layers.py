"""as_layers: any accepted model form as the list of layers a pipeline cuts (see parts.py)."""

from __future__ import annotations

from torch import nn

from .adapters import gpt2_parts, is_gpt2_layout, is_llama_layout, llama_parts
from .parts import PipelineParts


def as_layers(model: object) -> list[nn.Module]:
    """The model as a list of consecutive layers (see the module docstring)."""
    if isinstance(model, PipelineParts):
        layers = model.layers()
    elif hasattr(model, "pipeline_parts"):
        got = model.pipeline_parts()
        layers = got.layers() if isinstance(got, PipelineParts) else list(got)
    elif isinstance(model, (nn.Sequential, nn.ModuleList, list, tuple)):
        layers = list(model)
    elif is_gpt2_layout(model):
        layers = gpt2_parts(model).layers()
    elif is_llama_layout(model):
        layers = llama_parts(model).layers()
    else:
        raise TypeError(
            f"pipeline: cannot split a {type(model).__name__} into layers; pass an nn.Sequential, "
            "a list of modules, or PipelineParts(embed=..., blocks=[...], head=...), or give the "
            "model a pipeline_parts() method returning PipelineParts"
        )
    bad = [type(x).__name__ for x in layers if not isinstance(x, nn.Module)]
    if bad:
        raise TypeError(f"pipeline: layers must be nn.Modules, got {bad}")
    if not layers:
        raise ValueError("pipeline: the model has no layers")
    return layers
