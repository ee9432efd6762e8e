"""PipelineParts for models laid out like transformers' GPT2LMHeadModel and LlamaForCausalLM.

The attribute names are transformers' (and the project's reference models
follow them). Both take input ids (batch, seq) and return logits; attention is
causal with no padding mask. Llama's rotary cos/sin are computed once by the
embedding part and travel with the hidden states to every block, as tensors
that need no gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .parts import PipelineParts


def _first(out: Any) -> torch.Tensor:
    """A block's hidden states: transformers' blocks return a tuple (hidden, ...)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def _has(model: object, *paths: str) -> bool:
    for path in paths:
        obj = model
        for name in path.split("."):
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
    return True


def is_gpt2_layout(model: object) -> bool:
    return _has(
        model, "transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f", "lm_head"
    )


def is_llama_layout(model: object) -> bool:
    return _has(model, "model.embed_tokens", "model.layers", "model.norm", "lm_head")


class GPT2Embed(nn.Module):
    def __init__(self, wte: nn.Module, wpe: nn.Module, drop: nn.Module | None):
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop or nn.Identity()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.drop(self.wte(input_ids) + self.wpe(pos))


class HiddenBlock(nn.Module):
    """A transformer block called on hidden states, keeping only the hidden states."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return _first(self.block(hidden))


class NormHead(nn.Module):
    def __init__(self, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, x: Any) -> torch.Tensor:
        hidden = x[0] if isinstance(x, tuple) else x
        return self.lm_head(self.norm(hidden))


def gpt2_parts(model: nn.Module) -> PipelineParts:
    t = model.transformer
    return PipelineParts(
        embed=GPT2Embed(t.wte, t.wpe, getattr(t, "drop", None)),
        blocks=[HiddenBlock(b) for b in t.h],
        head=NormHead(t.ln_f, model.lm_head),
    )


class LlamaEmbed(nn.Module):
    """input ids -> (hidden, cos, sin); cos/sin from the model's rotary embedding."""

    def __init__(self, embed_tokens: nn.Module, rotary_emb: nn.Module):
        super().__init__()
        self.embed_tokens, self.rotary_emb = embed_tokens, rotary_emb

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.embed_tokens(input_ids)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).expand(
            input_ids.shape[0], -1
        )
        cos, sin = self.rotary_emb(hidden, pos)
        return hidden, cos, sin


class LlamaBlock(nn.Module):
    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(
        self, x: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        hidden, cos, sin = x
        return _first(self.layer(hidden, position_embeddings=(cos, sin))), cos, sin


def llama_parts(model: nn.Module) -> PipelineParts:
    m = model.model
    return PipelineParts(
        embed=LlamaEmbed(m.embed_tokens, m.rotary_emb),
        blocks=[LlamaBlock(layer) for layer in m.layers],
        head=NormHead(m.norm, model.lm_head),
    )
