"""All-to-all (Ulysses) attention for transformers' Llama-family decoders (Llama, Mistral,
Qwen2, Qwen3: *ForCausalLM, *ForSequenceClassification and *Model), the module ulysses.apply_ulysses puts in each
layer's `self_attn`.

transformers' LlamaModel (and its Mistral / Qwen siblings) computes the rotary embeddings and the attention mask for the
whole sequence before its first layer; the layers then run on this rank's sequence
shard (ulysses.py splits it before the first layer). Here q, k and v are projected on
the shard, rotated with this shard's rows of the whole sequence's cos / sin, k and v
expanded to the query heads (so any kv-head count works with any sp dividing the query
heads), exchanged to all tokens of heads / sp heads, attended with the model's own
attention function (config._attn_implementation: its mask, scaling and dropout), and
exchanged back before o_proj. Qwen3's per-head q_norm / k_norm run on the shard before
the rotation, as in its own attention; a sliding window (Mistral, Qwen2's sliding layers)
goes to the attention function as the model's own attention passes it, and applies to
whole-sequence positions since the exchange gives each rank every token.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from megalith_comm import ProcessGroup

from .policies.llama import FAMILIES
from .ulysses import heads_to_seq, seq_to_heads

#: transformers' decoders whose attention this module replaces (the Llama policy's families)
HF_CLASSES = tuple(
    f + head for f in FAMILIES for head in ("ForCausalLM", "ForSequenceClassification", "Model")
)


def is_hf_llama(model: nn.Module) -> bool:
    """A transformers Llama-family decoder (Llama, Mistral, Qwen2, Qwen3)."""
    cls = type(model)
    return cls.__name__ in HF_CLASSES and cls.__module__.startswith("transformers.")


def hf_layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers if hasattr(model, "model") else model.layers


def refuse_filled_cache(cache: Any, layer_idx: int) -> None:
    """transformers makes an empty cache whenever config.use_cache is on (training too):
    nothing to read from it; one already filled would hold other tokens' keys."""
    if cache is not None and cache.get_seq_length(layer_idx) > 0:
        raise NotImplementedError(
            "all-to-all sequence parallelism runs whole sequences, split over the sp "
            "ranks; it cannot continue from a key/value cache: generate without "
            "sequence parallelism"
        )


class UlyssesHFLlamaAttention(nn.Module):
    def __init__(self, attn: nn.Module, group: ProcessGroup) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
        )  # fmt: skip
        self.config, self.layer_idx, self.head_dim = attn.config, attn.layer_idx, attn.head_dim
        self.scaling, self.attention_dropout = attn.scaling, attn.attention_dropout
        self.is_causal = True
        # k and v arrive expanded to the query heads: the attention function repeats nothing
        self.num_key_value_groups = 1
        self.group = group
        # Qwen3's per-head norms (None elsewhere)
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        # Qwen2 sets it per layer (None on full-attention layers); Mistral reads its config
        self.sliding_window = getattr(
            attn, "sliding_window", getattr(attn.config, "sliding_window", None)
        )
        # the family's own rotation and eager attention (from its modeling module)
        family = sys.modules[type(attn).__module__]
        self.rotate, self.eager = family.apply_rotary_pos_emb, family.eager_attention_forward

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        refuse_filled_cache(cache, self.layer_idx)
        kwargs.pop("use_cache", None)
        kwargs.pop("position_ids", None)
        batch, seq, _ = hidden_states.shape
        r = self.group.rank
        shape = (batch, seq, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape)
        k = self.k_proj(hidden_states).view(shape)
        v = self.v_proj(hidden_states).view(shape)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = position_embeddings  # the whole sequence's: this shard's rows
        cos, sin = cos[:, r * seq : (r + 1) * seq], sin[:, r * seq : (r + 1) * seq]
        q, k = self.rotate(q, k, cos, sin, unsqueeze_dim=2)
        if self.sliding_window is not None:
            kwargs.setdefault("sliding_window", self.sliding_window)
        if k.shape[2] != q.shape[2]:
            repeat = q.shape[2] // k.shape[2]
            k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        q, k, v = (seq_to_heads(t, self.group).transpose(1, 2) for t in (q, k, v))
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, self.eager)
        y, _ = attend(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )  # [B, S, heads / sp, D]
        y = heads_to_seq(y, self.group)
        return self.o_proj(y.reshape(batch, seq, -1).contiguous()), None
