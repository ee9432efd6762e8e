"""Pipeline stages of transformers' Llama-shaped models (Llama, Mistral, Qwen2, Qwen3):
*Model, *ForCausalLM, *ForSequenceClassification (stages.py says how a head runs the
model's own forward).

embed: embed_tokens, and the rotary cos/sin of the positions (they travel with the hidden
states, needing no gradient); each block: the causal (and padding) mask from transformers'
create_causal_mask, then the decoder layer; head: norm, then the model's forward with
`model` given.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .stages import Held, check_cover, first, shape_proxy


def _positions(inputs: dict[str, Any], seq: int, device: torch.device) -> torch.Tensor:
    pos = inputs.get("position_ids")
    return pos if pos is not None else torch.arange(seq, device=device).unsqueeze(0)


class LlamaEmbed(nn.Module):
    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.embed_tokens, self.rotary_emb = trunk.embed_tokens, trunk.rotary_emb

    def forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        ids = inputs["input_ids"]
        hidden = self.embed_tokens(ids)
        cos, sin = self.rotary_emb(hidden, _positions(inputs, ids.shape[1], ids.device))
        return {"hidden": hidden, "inputs": inputs, "rope": (cos, sin)}


class LlamaStage(nn.Module):
    def __init__(self, layer: nn.Module, config: Any) -> None:
        super().__init__()
        self.layer = layer
        object.__setattr__(self, "config", config)

    def forward(self, x: dict[str, Any]) -> dict[str, Any]:
        from transformers.masking_utils import create_causal_mask

        inputs, hidden = x["inputs"], x["hidden"]
        proxy = shape_proxy(inputs, hidden)
        pos = _positions(inputs, proxy.shape[1], hidden.device)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=proxy,
            attention_mask=inputs.get("attention_mask"),
            cache=None,
            position_ids=pos,
        )
        out = self.layer(
            hidden, attention_mask=mask, position_ids=pos, position_embeddings=tuple(x["rope"])
        )
        return {**x, "hidden": first(out)}


class LlamaHead(Held):
    def __init__(self, model: nn.Module, trunk: nn.Module) -> None:
        super().__init__(model, () if trunk is model else ("model",))
        self.norm = trunk.norm
        self.is_trunk = trunk is model

    def forward(self, x: dict[str, Any]) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPast

        out = BaseModelOutputWithPast(last_hidden_state=self.norm(x["hidden"]))
        return out if self.is_trunk else self.run_model(x["inputs"], model=out)


def llama_stages(model: nn.Module) -> tuple[nn.Module, list[nn.Module], nn.Module]:
    trunk = model if hasattr(model, "embed_tokens") else model.model
    embed = LlamaEmbed(trunk)
    blocks = [LlamaStage(layer, trunk.config) for layer in trunk.layers]
    head = LlamaHead(model, trunk)
    check_cover(model, [embed, *blocks, head])
    return embed, blocks, head
