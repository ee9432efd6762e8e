"""Pipeline stages of transformers' GPT-2 models: GPT2Model, GPT2LMHeadModel,
GPT2DoubleHeadsModel, GPT2ForSequenceClassification, GPT2ForTokenClassification,
GPT2ForQuestionAnswering (stages.py says how a head runs the model's own forward).

embed: wte(input_ids) + wpe(positions) (+ wte(token_type_ids)), dropout; each block: the
causal (and padding) mask from transformers' create_causal_mask, then the block; head:
ln_f, then the model's forward with `transformer` given.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .stages import Held, check_cover, first, flat2d, shape_proxy


def _positions(inputs: dict[str, Any], seq: int, device: torch.device) -> torch.Tensor:
    pos = inputs.get("position_ids")
    if pos is not None:
        return flat2d(pos)
    return torch.arange(seq, device=device).unsqueeze(0)


class GPT2Embed(nn.Module):
    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = trunk.wte, trunk.wpe, trunk.drop

    def forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        ids = flat2d(inputs["input_ids"])
        hidden = self.wte(ids) + self.wpe(_positions(inputs, ids.shape[-1], ids.device))
        types = flat2d(inputs.get("token_type_ids"))
        if types is not None:
            hidden = hidden + self.wte(types)
        return {"hidden": self.drop(hidden), "inputs": inputs}


class GPT2Stage(nn.Module):
    def __init__(self, block: nn.Module, config: Any) -> None:
        super().__init__()
        self.block = block
        object.__setattr__(self, "config", config)

    def forward(self, x: dict[str, Any]) -> dict[str, Any]:
        from transformers.masking_utils import create_causal_mask

        inputs, hidden = x["inputs"], x["hidden"]
        proxy = shape_proxy(inputs, hidden)
        pos = _positions(inputs, proxy.shape[1], hidden.device)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=proxy,
            attention_mask=flat2d(inputs.get("attention_mask")),
            cache=None,
            position_ids=pos,
        )
        out = self.block(hidden, None, mask, None, use_cache=False, position_ids=pos)
        return {**x, "hidden": first(out)}


class GPT2Head(Held):
    def __init__(self, model: nn.Module, trunk: nn.Module) -> None:
        names = () if trunk is model else ("transformer",)
        super().__init__(model, names)
        self.ln_f = trunk.ln_f
        self.is_trunk = trunk is model

    def forward(self, x: dict[str, Any]) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

        inputs = x["inputs"]
        hidden = self.ln_f(x["hidden"])
        shape = inputs["input_ids"].shape
        hidden = hidden.view(*shape[:-1], hidden.shape[-2], hidden.shape[-1])
        out = BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden)
        if self.is_trunk:
            return out
        return self.run_model(inputs, transformer=out)


def gpt2_stages(model: nn.Module) -> tuple[nn.Module, list[nn.Module], nn.Module]:
    trunk = getattr(model, "transformer", model)
    embed = GPT2Embed(trunk)
    blocks = [GPT2Stage(b, trunk.config) for b in trunk.h]
    head = GPT2Head(model, trunk)
    check_cover(model, [embed, *blocks, head])
    return embed, blocks, head
