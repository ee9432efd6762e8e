"""A GPT-2 decoder whose parameters carry GPT2LMHeadModel's names and layouts.

transformer.wte, transformer.wpe, transformer.h.N.{ln_1, attn.c_attn,
attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}, transformer.ln_f, lm_head (tied to
wte). The projections store [in, out] weights, as GPT-2's checkpoints do.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .base import Block, CausalLM
from .config import GPTConfig
from .layers import InOutLinear


class GPTAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.dropout = config.dropout
        self.c_attn = InOutLinear(config.d_model, 3 * config.d_model)
        self.c_proj = InOutLinear(config.d_model, config.d_model)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = self.c_attn(x).split(d_model, dim=-1)
        q, k, v = (t.view(batch, seq, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(batch, seq, d_model)
        return self.resid_dropout(self.c_proj(y))


class GPTMLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = InOutLinear(config.d_model, config.d_ff)
        self.c_proj = InOutLinear(config.d_ff, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT-2's "gelu_new" is the tanh approximation.
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class GPTBlock(Block):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.attn = GPTAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.mlp = GPTMLP(config)

    def block_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.ln_1(hidden))
        return hidden + self.mlp(self.ln_2(hidden))


def embed_with_positions(
    wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Dropout, input_ids: torch.Tensor
) -> torch.Tensor:
    seq = input_ids.shape[-1]
    if seq > wpe.num_embeddings:
        raise ValueError(
            f"sequence length {seq} is over this GPT's max_seq_len ({wpe.num_embeddings}): "
            f"shorten the input or create the model with max_seq_len={seq}"
        )
    positions = torch.arange(seq, device=input_ids.device)
    return drop(wte(input_ids) + wpe(positions))


class GPTEmbedding(nn.Module):
    """Token plus learned position embeddings: input_ids -> hidden (the pipeline's first part)."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Dropout) -> None:
        super().__init__()
        self.wte = wte
        self.wpe = wpe
        self.drop = drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return embed_with_positions(self.wte, self.wpe, self.drop, input_ids)


class GPTTransformer(nn.Module):
    """The container GPT2LMHeadModel calls `transformer`."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.max_seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(GPTBlock(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.norm_eps)


class GPTLMHeadModel(CausalLM):
    """GPT-2. Build it with megalith.models.create("gpt2-124m", ...) or from a GPTConfig."""

    config: GPTConfig

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        self.transformer = GPTTransformer(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.tied_weights = {"lm_head.weight": "transformer.wte.weight"}
            self.tie_weights()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.transformer.h

    @property
    def final_norm(self) -> nn.Module:
        return self.transformer.ln_f

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        return embed_with_positions(t.wte, t.wpe, t.drop, input_ids)

    def embedding_part(self) -> GPTEmbedding:
        t = self.transformer
        return GPTEmbedding(t.wte, t.wpe, t.drop)

    def init_rule(self, name: str) -> tuple[str, float]:
        std = self.config.initializer_range
        leaf = name.rsplit(".", 1)[-1]
        if ".ln_" in name:
            return ("ones", 0.0) if leaf == "weight" else ("zeros", 0.0)
        if leaf == "bias":
            return ("zeros", 0.0)
        if name.endswith("c_proj.weight"):
            # GPT-2: projections into the residual stream shrink with depth (two per block).
            return ("normal", std / math.sqrt(2 * self.config.n_layers))
        return ("normal", std)
