"""Named model sizes, from test-sized to 70B.

gpt2-*: the four GPT-2 releases (vocabulary 50257, 1024 positions), so their
published weights load. gpt-<size>: the GPT-3 paper's shapes at sequence 2048
with the vocabulary padded to 50304 (a multiple of 64); gpt-1.3b (16 heads) and
gpt-6.7b are the models ../shared ANCHORS.md measures plain torch on.
llama-7b/13b/70b: Llama 2's shapes; llama3-8b: Llama 3's; llama-1b: Llama 3.2
1B's shape (tied embeddings) with plain RoPE, as megalith has no RoPE scaling.
tiny/small: for tests and CPU runs.
"""

from __future__ import annotations

from typing import Any

from .config import GPTConfig, LlamaConfig, ModelConfig

GPT2_VOCAB = 50257
PADDED_GPT_VOCAB = 50304


def _gpt(name: str, d: int, layers: int, heads: int, **kw: Any) -> GPTConfig:
    kw.setdefault("vocab_size", PADDED_GPT_VOCAB)
    kw.setdefault("max_seq_len", 2048)
    return GPTConfig(name=name, d_model=d, n_layers=layers, n_heads=heads, d_ff=4 * d, **kw)


def _gpt2(name: str, d: int, layers: int, heads: int) -> GPTConfig:
    return _gpt(name, d, layers, heads, vocab_size=GPT2_VOCAB, max_seq_len=1024)


def _llama(name: str, d: int, layers: int, heads: int, kv: int, ff: int, **kw: Any) -> LlamaConfig:
    return LlamaConfig(
        name=name, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv, d_ff=ff, **kw
    )


_LLAMA3 = {"vocab_size": 128256, "rope_theta": 500000.0, "max_seq_len": 8192}

PRESETS: dict[str, ModelConfig] = {
    config.name: config
    for config in (
        _gpt("gpt-tiny", 128, 4, 4, max_seq_len=256),
        _gpt("gpt-small", 384, 6, 6, max_seq_len=1024),
        _gpt2("gpt2-124m", 768, 12, 12),
        _gpt2("gpt2-355m", 1024, 24, 16),
        _gpt2("gpt2-774m", 1280, 36, 20),
        _gpt2("gpt2-1.5b", 1600, 48, 25),
        _gpt("gpt-125m", 768, 12, 12),
        _gpt("gpt-350m", 1024, 24, 16),
        _gpt("gpt-760m", 1536, 24, 16),
        _gpt("gpt-1.3b", 2048, 24, 16),
        _gpt("gpt-2.7b", 2560, 32, 32),
        _gpt("gpt-6.7b", 4096, 32, 32),
        _gpt("gpt-13b", 5120, 40, 40),
        _gpt("gpt-30b", 7168, 48, 56),
        _gpt("gpt-175b", 12288, 96, 96),
        _llama("llama-tiny", 128, 4, 4, 2, 352, max_seq_len=256),
        _llama("llama-small", 768, 12, 12, 4, 2048, max_seq_len=1024),
        _llama("llama-1b", 2048, 16, 32, 8, 8192, tie_word_embeddings=True, **_LLAMA3),
        _llama("llama-7b", 4096, 32, 32, 32, 11008),
        _llama("llama3-8b", 4096, 32, 32, 8, 14336, **_LLAMA3),
        _llama("llama-13b", 5120, 40, 40, 40, 13824),
        _llama("llama-70b", 8192, 80, 64, 8, 28672),
    )
}


def list_models() -> list[str]:
    """The preset names, in order of family and size."""
    return list(PRESETS)


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The named preset, with fields replaced by `overrides` (vocab_size=256, ...)."""
    try:
        config = PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(PRESETS)} "
            "(or pass a GPTConfig / LlamaConfig)"
        ) from None
    return config.replace(**overrides) if overrides else config
