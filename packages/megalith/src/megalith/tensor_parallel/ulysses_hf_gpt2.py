"""All-to-all (Ulysses) attention for transformers' GPT-2 models (GPT2Model, GPT2LMHeadModel
and the other GPT-2 heads), the module ulysses.apply_ulysses puts in each block's `attn`.

GPT-2's positions are added to the embeddings before the first block and its mask is made
for the whole sequence, so the blocks run on this rank's sequence shard untouched
(ulysses.py splits the hidden states before the first block, gathers them after the last).
Here q, k and v come from c_attn on the shard (under tensor parallelism, this rank's heads'
slices: the policy narrows split_size), are exchanged to all tokens of heads / sp heads,
attended with the model's own attention function (config._attn_implementation: its mask,
scaling and dropout) and exchanged back before c_proj.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from megalith_comm import ProcessGroup

from .policies.gpt2 import _is_hf as is_hf
from .ulysses import heads_to_seq, seq_to_heads
from .ulysses_hf import refuse_filled_cache


def is_hf_gpt2(model: nn.Module) -> bool:
    """A transformers GPT-2 model of a class the tensor-parallel policy covers."""
    return is_hf(model)


def gpt2_blocks(model: nn.Module) -> nn.ModuleList:
    return getattr(model, "transformer", model).h


def check_gpt2_config(config: Any) -> None:
    """ValueError for the GPT-2 options this attention does not run."""
    if getattr(config, "add_cross_attention", False):
        raise ValueError(
            "all-to-all sequence parallelism: GPT-2 with add_cross_attention=True is not "
            "supported; use sequence_parallelism_mode='split_gather' (with tp_size > 1)"
        )
    if getattr(config, "reorder_and_upcast_attn", False):
        raise ValueError(
            "all-to-all sequence parallelism: GPT-2's reorder_and_upcast_attn=True is not "
            "supported; set config.reorder_and_upcast_attn=False"
        )


class UlyssesHFGPT2Attention(nn.Module):
    def __init__(self, attn: nn.Module, group: ProcessGroup) -> None:
        super().__init__()
        self.c_attn, self.c_proj = attn.c_attn, attn.c_proj
        self.attn_dropout, self.resid_dropout = attn.attn_dropout, attn.resid_dropout
        self.config, self.layer_idx, self.head_dim = attn.config, attn.layer_idx, attn.head_dim
        self.split_size, self.scaling = attn.split_size, attn.scaling
        self.is_causal = True
        self.group = group

    def forward(
        self,
        hidden_states: torch.Tensor,
        cache: Any = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.gpt2.modeling_gpt2 import eager_attention_forward

        refuse_filled_cache(cache, self.layer_idx)
        for name in ("use_cache", "position_ids", "output_attentions"):
            kwargs.pop(name, None)
        batch, seq, _ = hidden_states.shape
        shape = (batch, seq, -1, self.head_dim)
        q, k, v = (t.view(shape) for t in self.c_attn(hidden_states).split(self.split_size, 2))
        q, k, v = (seq_to_heads(t, self.group).transpose(1, 2) for t in (q, k, v))
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        y, _ = attend(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=self.attn_dropout.p if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )  # [B, S, heads / sp, D]
        y = heads_to_seq(y, self.group)
        y = self.c_proj(y.reshape(batch, seq, -1).contiguous())
        return self.resid_dropout(y), None
