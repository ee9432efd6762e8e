"""All-to-all (Ulysses-style) sequence parallelism for megalith.models decoders and
transformers' Llama family (Llama, Mistral, Qwen2, Qwen3; *ForCausalLM,
*ForSequenceClassification, *Model: ulysses_hf.py)
and transformers' GPT-2 models (ulysses_hf_gpt2.py).

Every rank of the sequence group holds the whole model and a shard of the
sequence. Outside attention nothing needs the other tokens; inside it, an
all-to-all turns [batch, seq / sp, heads, head_dim] into [batch, seq, heads / sp,
head_dim] (each rank: all tokens, its heads), attention runs, and the inverse
all-to-all brings the rank its tokens back. The blocks' parameters see only this
rank's tokens, so their gradients are all-reduced over the group; the embedding
and head run on the whole sequence (split before the first block, gathered after
the last), as in the Megatron-style mode.

    apply_ulysses(model, sp_group)   # in place; heads must divide by sp

Beside tensor parallelism (a model already sharded by its policy over a tp group of a
Mesh(dp, sp, tp)), each rank's attention holds heads / tp heads, and the exchange
splits those over sp: heads must divide by tp x sp. The tp collectives of the
projections run on sequence shards, unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import megalith_comm as comm
from megalith_comm import ProcessGroup

from .sequence import reduce_partial_grads, sequence_parallel_span

#: marks a parameter whose gradient is already all-reduced over the sp group
SP_FLAG = "sp_grad_reduced"


def _all_to_all(x: torch.Tensor, scatter: int, gather: int, group: ProcessGroup) -> torch.Tensor:
    if group.size == 1:
        return x
    send = torch.stack(x.chunk(group.size, dim=scatter)).contiguous()
    recv = torch.empty_like(send)
    comm.all_to_all(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather)


class _SeqToHeads(torch.autograd.Function):
    """[B, S/sp, H, D] -> [B, S, H/sp, D]; backward the inverse."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_to_all(x, 2, 1, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, 1, 2, ctx.group), None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_to_all(x, 1, 2, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, 2, 1, ctx.group), None


def seq_to_heads(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _SeqToHeads.apply(x, group)


def heads_to_seq(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _HeadsToSeq.apply(x, group)


def _attend(q, k, v, group, dropout: float) -> torch.Tensor:
    """q, k, v: [B, S/sp, heads, D] (k, v with as many heads as q) -> [B, S/sp, heads, D]."""
    q, k, v = (seq_to_heads(t, group).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    return heads_to_seq(y.transpose(1, 2), group)


class UlyssesGPTAttention(nn.Module):
    def __init__(self, attn: nn.Module, group: ProcessGroup) -> None:
        super().__init__()
        self.c_attn, self.c_proj, self.resid_dropout = attn.c_attn, attn.c_proj, attn.resid_dropout
        # megalith's GPT attention, or its tensor-parallel form (this rank's heads)
        self.n_heads = getattr(attn, "n_local_heads", None) or attn.n_heads
        self.width = getattr(attn, "local_width", None)
        self.dropout, self.group = attn.dropout, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        width = self.width or d
        qkv = self.c_attn(x).split(width, -1)
        q, k, v = (t.view(batch, seq, self.n_heads, -1) for t in qkv)
        y = _attend(q, k, v, self.group, self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.reshape(batch, seq, width)))


class UlyssesLlamaAttention(nn.Module):
    def __init__(self, attn: nn.Module, group: ProcessGroup) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
        )  # fmt: skip
        self.n_heads, self.n_kv_heads = attn.n_heads, attn.n_kv_heads
        self.head_dim, self.rope_theta, self.group = attn.head_dim, attn.rope_theta, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megalith.models.layers import apply_rope, rope_cos_sin

        batch, seq, _ = x.shape
        sp, r = self.group.size, self.group.rank
        q = self.q_proj(x).view(batch, seq, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        # RoPE at this shard's global positions, before the exchange.
        cos, sin = rope_cos_sin(seq * sp, self.head_dim, self.rope_theta, x.device, x.dtype)
        cos, sin = cos[r * seq : (r + 1) * seq], sin[r * seq : (r + 1) * seq]
        q = apply_rope(q.transpose(1, 2), cos, sin).transpose(1, 2)
        k = apply_rope(k.transpose(1, 2), cos, sin).transpose(1, 2)
        if self.n_kv_heads != self.n_heads:
            # Expanded before the exchange, so any kv count works with any sp dividing heads.
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        y = _attend(q, k, v, self.group, 0.0)
        return self.o_proj(y.reshape(batch, seq, -1))


def _with_hooks_of(old: nn.Module, new: nn.Module) -> nn.Module:
    """`new` with `old`'s forward hooks: a tensor-parallel policy enters its region
    (tp's copy / gather of the input) in a pre-hook on the attention module."""
    for name in (
        "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
        "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    ):  # fmt: skip
        getattr(new, name).update(getattr(old, name))
    return new


def validate_ulysses(model: nn.Module, sp: int, tp: int = 1) -> None:
    """ValueError with the numbers unless apply_ulysses can split this model over sp ranks
    (beside tp-way tensor parallelism)."""
    from megalith.models import GPTLMHeadModel, LlamaForCausalLM

    from .ulysses_hf import is_hf_llama
    from .ulysses_hf_gpt2 import check_gpt2_config, is_hf_gpt2

    hf = is_hf_llama(model)
    gpt2 = is_hf_gpt2(model)
    if not (hf or gpt2) and not isinstance(model, (GPTLMHeadModel, LlamaForCausalLM)):
        cls = type(model)
        raise ValueError(
            "all-to-all sequence parallelism supports megalith.models.GPTLMHeadModel, "
            "megalith.models.LlamaForCausalLM and transformers' LlamaForCausalLM, "
            "LlamaForSequenceClassification and LlamaModel (and the Mistral, Qwen2 and Qwen3 "
            "ones) and GPT-2 models (GPT2Model, GPT2LMHeadModel, GPT2ForSequenceClassification, "
            "...) for now, not "
            f"{cls.__module__}.{cls.__name__}; use "
            "sequence_parallelism_mode='split_gather' (with tp_size > 1) for other models"
        )
    if gpt2:
        check_gpt2_config(model.config)
        heads = model.config.n_head
    else:
        heads = model.config.num_attention_heads if hf else model.config.n_heads
    if heads % (sp * tp):
        raise ValueError(
            f"all-to-all sequence parallelism: sp_size {sp} x tp_size {tp} = {sp * tp} does not "
            f"divide the number of attention heads ({heads}): choose sizes whose product "
            f"divides {heads}"
        )


def apply_ulysses(model: nn.Module, group: ProcessGroup) -> nn.Module:
    """All-to-all sequence parallelism over group for a megalith.models GPT or Llama, or a
    transformers Llama, in place."""
    from megalith.models import GPTLMHeadModel

    from .ulysses_hf import UlyssesHFLlamaAttention, hf_layers, is_hf_llama
    from .ulysses_hf_gpt2 import UlyssesHFGPT2Attention, gpt2_blocks, is_hf_gpt2

    tp_info = getattr(model, "tp_info", None)
    validate_ulysses(model, group.size, tp_info.group.size if tp_info is not None else 1)
    if is_hf_gpt2(model):
        blocks = gpt2_blocks(model)
        for block in blocks:
            block.attn = _with_hooks_of(block.attn, UlyssesHFGPT2Attention(block.attn, group))
        sequence_parallel_span(blocks[0], blocks[-1], group)
        reduce_partial_grads([p for b in blocks for p in b.parameters()], group, SP_FLAG)
        return model
    if is_hf_llama(model):
        layers = hf_layers(model)
        for layer in layers:
            layer.self_attn = _with_hooks_of(
                layer.self_attn, UlyssesHFLlamaAttention(layer.self_attn, group)
            )
        sequence_parallel_span(layers[0], layers[-1], group)
        reduce_partial_grads([p for layer in layers for p in layer.parameters()], group, SP_FLAG)
        return model
    gpt = isinstance(model, GPTLMHeadModel)
    for block in model.blocks:
        if gpt:
            block.attn = _with_hooks_of(block.attn, UlyssesGPTAttention(block.attn, group))
        else:
            block.self_attn = _with_hooks_of(
                block.self_attn, UlyssesLlamaAttention(block.self_attn, group)
            )
    sequence_parallel_span(model.blocks[0], model.blocks[-1], group)
    reduce_partial_grads([p for b in model.blocks for p in b.parameters()], group, SP_FLAG)
    return model
