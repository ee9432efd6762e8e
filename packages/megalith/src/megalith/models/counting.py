"""Parameter and FLOP counts from a config alone, so a 70B model needs no memory to size.

FLOPs per token follow the PaLM appendix convention that ../shared ANCHORS.md
uses for MFU: 6 * N for the matmuls of forward plus backward, where N leaves
out the input embedding tables (a lookup, not a matmul) but keeps the output
projection (tied or not), plus 12 * n_layers * d_model * seq_len for the
attention scores and their weighted sum (no discount for the causal mask).
"""

from __future__ import annotations

from torch import nn

from .config import GPTConfig, LlamaConfig, ModelConfig


def _config(model_or_config: ModelConfig | nn.Module) -> ModelConfig:
    if isinstance(model_or_config, ModelConfig):
        return model_or_config
    config = getattr(model_or_config, "config", None)
    if not isinstance(config, ModelConfig):
        raise TypeError(
            f"expected a megalith model or ModelConfig, got {type(model_or_config).__name__}"
        )
    return config


def block_parameters(config: ModelConfig) -> int:
    """Parameters in one decoder block."""
    d, ff = config.d_model, config.d_ff
    if isinstance(config, GPTConfig):
        # c_attn 3d^2+3d, attn c_proj d^2+d, c_fc d*ff+ff, mlp c_proj ff*d+d, two LayerNorms 4d
        return 4 * d * d + 2 * d * ff + ff + 9 * d
    if isinstance(config, LlamaConfig):
        kv = config.num_kv_heads * config.head_dim
        # q and o d^2 each, k and v d*kv each, gate/up/down d*ff each, two RMSNorms d each
        return 2 * d * d + 2 * d * kv + 3 * d * ff + 2 * d
    raise TypeError(f"no parameter formula for {type(config).__name__}")


def embedding_parameters(config: ModelConfig) -> int:
    """Parameters in the input lookup tables (token, and GPT's position table)."""
    tables = config.vocab_size * config.d_model
    if isinstance(config, GPTConfig):
        tables += config.max_seq_len * config.d_model
    return tables


def num_parameters(model_or_config: ModelConfig | nn.Module) -> int:
    """All parameters, a tied embedding counted once."""
    config = _config(model_or_config)
    d = config.d_model
    final_norm = 2 * d if isinstance(config, GPTConfig) else d
    head = 0 if config.tie_word_embeddings else config.vocab_size * d
    return (
        embedding_parameters(config)
        + config.n_layers * block_parameters(config)
        + final_norm
        + head
    )


def num_flop_parameters(model_or_config: ModelConfig | nn.Module) -> int:
    """N of the 6N rule: the parameters that take part in a matmul for every token."""
    config = _config(model_or_config)
    n = num_parameters(config) - embedding_parameters(config)
    if config.tie_word_embeddings:
        n += config.vocab_size * config.d_model  # the token table is also the output projection
    return n


def flops_per_token(model_or_config: ModelConfig | nn.Module, seq_len: int | None = None) -> int:
    """Training FLOPs (forward + backward) per token at `seq_len` (default: max_seq_len)."""
    config = _config(model_or_config)
    seq = config.max_seq_len if seq_len is None else seq_len
    attention = 12 * config.n_layers * config.n_heads * config.head_dim * seq
    return 6 * num_flop_parameters(config) + attention


def mfu(
    tokens_per_second: float,
    model_or_config: ModelConfig | nn.Module,
    peak_flops: float,
    seq_len: int | None = None,
) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the hardware's peak (per device
    when tokens_per_second is per device). Recomputation under activation checkpointing
    is not counted, as MFU's definition asks.
    """
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops}")
    return tokens_per_second * flops_per_token(model_or_config, seq_len) / peak_flops
