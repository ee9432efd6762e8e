"""A Llama decoder whose parameters carry LlamaForCausalLM's names.

model.embed_tokens, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head.
RMSNorm, rotary position embeddings (rotate-half layout), SwiGLU MLP and
grouped-query attention through torch's scaled_dot_product_attention; no biases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Block, CausalLM
from .config import LlamaConfig
from .layers import RMSNorm, apply_rope, rope_cos_sin


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        d, kv_dim = config.d_model, config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(d, config.n_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * config.head_dim, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(seq, self.head_dim, self.rope_theta, x.device, x.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.n_kv_heads != self.n_heads:
            # Each kv head serves n_heads / n_kv_heads consecutive query heads. Expanding
            # here (rather than SDPA's enable_gqa) keeps every SDPA backend available.
            repeat = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, -1))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(Block):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = LlamaMLP(config)

    def block_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaEmbedding(nn.Module):
    """Token embeddings: input_ids -> hidden (the pipeline's first part); RoPE acts in the blocks."""

    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class LlamaModel(nn.Module):
    """The container LlamaForCausalLM calls `model`."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, eps=config.norm_eps)


class LlamaForCausalLM(CausalLM):
    """Llama. Build it with megalith.models.create("llama-7b", ...) or from a LlamaConfig."""

    config: LlamaConfig

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.tied_weights = {"lm_head.weight": "model.embed_tokens.weight"}
            self.tie_weights()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.layers

    @property
    def final_norm(self) -> nn.Module:
        return self.model.norm

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def embedding_part(self) -> LlamaEmbedding:
        return LlamaEmbedding(self.model.embed_tokens)

    def init_rule(self, name: str) -> tuple[str, float]:
        # As transformers' LlamaPreTrainedModel: every Linear and the embedding N(0, std),
        # every RMSNorm weight one.
        if name.endswith("norm.weight"):
            return ("ones", 0.0)
        return ("normal", self.config.initializer_range)
