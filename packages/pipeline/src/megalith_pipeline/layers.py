"""as_layers: any accepted model form as the list of layers a pipeline cuts (see parts.py);
named_ties: parameters a model declares tied that are distinct objects."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .adapters import gpt2_parts, is_gpt2_layout, is_llama_layout, llama_parts
from .parts import PipelineParts


def _from_parts(got: object) -> list[nn.Module]:
    """PipelineParts, a list of layers, or an (embed, blocks, head) triple."""
    if isinstance(got, PipelineParts):
        return got.layers()
    items = list(got)  # type: ignore[call-overload]
    if len(items) == 3 and isinstance(items[1], (Sequence, nn.ModuleList)):
        return PipelineParts(*items).layers()
    return items


def as_layers(model: object) -> list[nn.Module]:
    """The model as a list of consecutive layers (see parts.py)."""
    if isinstance(model, PipelineParts):
        layers = model.layers()
    elif hasattr(model, "pipeline_parts"):
        layers = _from_parts(model.pipeline_parts())
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
            "model a pipeline_parts() method returning PipelineParts or (embed, blocks, head)"
        )
    bad = [type(x).__name__ for x in layers if not isinstance(x, nn.Module)]
    if bad:
        raise TypeError(f"pipeline: layers must be nn.Modules, got {bad}")
    if not layers:
        raise ValueError("pipeline: the model has no layers")
    return layers


def named_ties(model: object) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """Pairs from the model's `tied_weights` ({name: source name}) that are two Parameter
    objects (a copy materialised apart, on another stage); their gradients are summed."""
    tied = getattr(model, "tied_weights", None)
    if not isinstance(tied, dict) or not isinstance(model, nn.Module):
        return []
    pairs = []
    for name, source in tied.items():
        a, b = model.get_parameter(name), model.get_parameter(source)
        if a is not b:
            pairs.append((a, b))
    return pairs
