"""Pipeline stages of transformers' BERT models: BertModel and every Bert* head of bert.py
(stages.py says how a head runs the model's own forward).

embed: bert.embeddings (multiple-choice inputs flattened to (batch * choices, seq) as the
head's forward does); each block: the mask BertModel's forward builds, from transformers' masking functions
(bidirectional, or causal for BertLMHeadModel), then the layer; head: the pooler when the
model has one, then the model's forward with `bert` given.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .stages import Held, check_cover, first, flat2d, shape_proxy


class BertEmbed(nn.Module):
    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.embeddings = trunk.embeddings

    def forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        hidden = self.embeddings(
            input_ids=flat2d(inputs["input_ids"]),
            token_type_ids=flat2d(inputs.get("token_type_ids")),
            position_ids=flat2d(inputs.get("position_ids")),
        )
        return {"hidden": hidden, "inputs": inputs}


class BertStage(nn.Module):
    def __init__(self, layer: nn.Module, trunk: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        object.__setattr__(self, "trunk", trunk)  # for its mask function only

    def forward(self, x: dict[str, Any]) -> dict[str, Any]:
        inputs, hidden = x["inputs"], x["hidden"]
        mask = self_attention_mask(
            self.trunk.config,
            shape_proxy(inputs, hidden),
            flat2d(inputs.get("attention_mask")),
            flat2d(inputs.get("position_ids")),
        )
        return {**x, "hidden": first(self.layer(hidden, mask))}


def self_attention_mask(
    config: Any, proxy: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor | None
) -> Any:
    """BertModel's self-attention mask. Called through transformers' public masking functions,
    not BertModel._create_attention_masks, whose arguments change between releases (5.25 added
    position_ids); position_ids goes only to a function that takes it."""
    import inspect

    from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

    make = create_causal_mask if config.is_decoder else create_bidirectional_mask
    kwargs: dict[str, Any] = dict(config=config, inputs_embeds=proxy, attention_mask=mask)
    if "position_ids" in inspect.signature(make).parameters:
        kwargs["position_ids"] = positions
    return make(cache=None, **kwargs)


class BertHead(Held):
    def __init__(self, model: nn.Module, trunk: nn.Module) -> None:
        super().__init__(model, () if trunk is model else ("bert",))
        self.pooler = trunk.pooler
        self.is_trunk = trunk is model

    def forward(self, x: dict[str, Any]) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions

        hidden = x["hidden"]
        pooled = self.pooler(hidden) if self.pooler is not None else None
        out = BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=hidden, pooler_output=pooled
        )
        return out if self.is_trunk else self.run_model(x["inputs"], bert=out)


def bert_stages(model: nn.Module) -> tuple[nn.Module, list[nn.Module], nn.Module]:
    trunk = getattr(model, "bert", model)
    embed = BertEmbed(trunk)
    blocks = [BertStage(layer, trunk) for layer in trunk.encoder.layer]
    head = BertHead(model, trunk)
    check_cover(model, [embed, *blocks, head])
    return embed, blocks, head
