"""Pipeline stages of transformers models, task heads included: what every family shares.

A family's policy cuts a model into [embed, *blocks, head] (megalith_pipeline's
PipelineParts); its stage modules live in <family>_stages.py. Between stages flows a
dict (megalith_pipeline sends tensors, dicts and tuples of them):

    {"hidden": hidden states, "inputs": the micro-batch's model inputs, ...family extras}

"inputs" are the keyword arguments the model's own forward takes (input_ids,
attention_mask, token_type_ids, labels, ...), so every stage rebuilds its attention mask
with transformers' own mask functions, and the head computes exactly what the model
computes: it runs the model's own forward with the trunk (model.transformer, model.model,
model.bert, model.encoder / decoder) replaced, for that one call, by a module that returns
the trunk's output the stages computed (`given`). So the head's pooling, loss and output
type (SequenceClassifierOutput, CausalLMOutputWithCrossAttentions, ...) are the model's.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


class Given(nn.Module):
    """Stands in for a trunk module during one head forward: returns what it was given."""

    def __init__(self, output: Any) -> None:
        super().__init__()
        self.output = output

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.output


@contextlib.contextmanager
def given(owner: nn.Module, /, **outputs: Any) -> Iterator[None]:
    """owner's children named in outputs return those outputs inside the block."""
    saved = {name: owner._modules[name] for name in outputs}
    try:
        for name, out in outputs.items():
            owner._modules[name] = Given(out)
        yield
    finally:
        owner._modules.update(saved)


def first(out: Any) -> Any:
    """A block's hidden states (older transformers blocks return a tuple)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def shape_proxy(inputs: dict[str, Any], hidden: torch.Tensor) -> torch.Tensor:
    """A (batch, full sequence, 1) tensor of the hidden states' dtype and device: what
    transformers' mask functions read from inputs_embeds. The hidden states themselves may
    be sequence shards (sequence parallelism), the mask is for the whole sequence."""
    ids = inputs.get("input_ids")
    if ids is None:
        return hidden
    flat = ids.reshape(-1, ids.shape[-1])
    return hidden.new_empty(flat.shape[0], flat.shape[1], 1)


def flat2d(t: torch.Tensor | None) -> torch.Tensor | None:
    """(batch, choices, seq) -> (batch * choices, seq), as multiple-choice heads do."""
    return None if t is None else t.reshape(-1, t.shape[-1])


class Held(nn.Module):
    """A head's modules: the trunk's last ones and the model's own head modules.

    model: the whole model (not registered here: the other stages hold its other
    parameters); trunk_names: the model's children the head replaces with `given`."""

    def __init__(self, model: nn.Module, trunk_names: tuple[str, ...], skip: tuple[str, ...] = ()):
        super().__init__()
        object.__setattr__(self, "model", model)  # plain attribute: not a submodule
        self.trunk_names = trunk_names
        self.heads = nn.ModuleDict(
            {
                name: child
                for name, child in model.named_children()
                if name not in trunk_names and name not in skip
            }
        )

    def run_model(self, inputs: dict[str, Any], **trunk_outputs: Any) -> Any:
        with given(self.model, **trunk_outputs):
            return self.model.forward(**inputs)


def check_cover(model: nn.Module, layers: list[nn.Module]) -> None:
    """Every parameter of the model sits in some stage (a head this file does not know
    would otherwise lose parameters silently)."""
    held = {id(p) for layer in layers for p in layer.parameters()}
    missing = [n for n, p in model.named_parameters() if id(p) not in held]
    if missing:
        raise ValueError(
            f"pipeline: {type(model).__name__} has parameters no pipeline stage holds: "
            f"{missing[:5]}; pass HybridParallelPlugin(custom_policy=...) whose policy's "
            "pipeline_parts(model) covers them"
        )


def forward_names(model: nn.Module) -> frozenset[str]:
    """The keyword arguments model.forward takes."""
    params = inspect.signature(type(model).forward).parameters
    return frozenset(n for n in params if n != "self")


def model_inputs(model: nn.Module, batch: Any) -> dict[str, Any]:
    """The micro-batch's tensors the model's forward takes, by name (a tensor batch is
    input_ids; a tuple or list batch starts with them)."""
    if isinstance(batch, torch.Tensor):
        return {"input_ids": batch}
    if isinstance(batch, (tuple, list)):
        return {"input_ids": batch[0]}
    if not isinstance(batch, dict):
        raise TypeError(
            f"execute_pipeline: a batch is a dict of tensors (or input ids), got "
            f"{type(batch).__name__}"
        )
    names = forward_names(model)
    out = {k: v for k, v in batch.items() if k in names and isinstance(v, torch.Tensor)}
    if "input_ids" not in out:
        raise ValueError(
            f"execute_pipeline: the batch needs 'input_ids' (got keys {sorted(batch)})"
        )
    return out
