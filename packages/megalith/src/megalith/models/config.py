"""Model configurations: frozen dataclasses that validate themselves.

Field names are megalith's own and shared by both families (d_model, n_layers,
n_heads, d_ff, max_seq_len, vocab_size), so the CLI and the FLOP counter treat
them alike; `megalith.models.hf` maps them to transformers' config.json keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ModelConfig:
    """What every decoder has. Use GPTConfig or LlamaConfig."""

    family: ClassVar[str] = ""

    name: str = "custom"
    vocab_size: int = 50257
    max_seq_len: int = 1024
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for field in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads", "d_ff"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{self.name}: {field} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"{self.name}: d_model ({self.d_model}) must be divisible by n_heads "
                f"({self.n_heads}); d_model % n_heads = {self.d_model % self.n_heads}"
            )
        if self.initializer_range <= 0 or self.norm_eps <= 0:
            raise ValueError(
                f"{self.name}: initializer_range ({self.initializer_range}) and norm_eps "
                f"({self.norm_eps}) must be positive"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again); unknown names are an error."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} has no field(s) {unknown}; fields are {sorted(known)}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, **dataclasses.asdict(self)}

    def to_hf_config(self, dtype: torch.dtype | None = None) -> dict[str, Any]:
        """transformers' config.json content for the matching *ForCausalLM class."""
        import torch

        from .hf import to_hf_config

        return to_hf_config(self, dtype or torch.float32)


@dataclass(frozen=True)
class GPTConfig(ModelConfig):
    """GPT-2: learned positions, pre-LayerNorm, fused qkv, GELU (tanh) MLP, tied head."""

    family: ClassVar[str] = "gpt"

    dropout: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{self.name}: dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """Llama: RoPE, RMSNorm, SwiGLU MLP, grouped-query attention, no biases."""

    family: ClassVar[str] = "llama"

    vocab_size: int = 32000
    max_seq_len: int = 4096
    d_model: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    d_ff: int = 11008
    tie_word_embeddings: bool = False
    norm_eps: float = 1e-5
    n_kv_heads: int | None = None  # None: as many as n_heads (plain multi-head attention)
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        super().__post_init__()
        kv = self.num_kv_heads
        if kv <= 0 or self.n_heads % kv:
            raise ValueError(
                f"{self.name}: n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({kv})"
            )
        if self.head_dim % 2:
            raise ValueError(f"{self.name}: RoPE needs an even head_dim, got {self.head_dim}")
        if self.rope_theta <= 0:
            raise ValueError(f"{self.name}: rope_theta must be positive, got {self.rope_theta}")

    @property
    def num_kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


CONFIG_CLASSES: dict[str, type[ModelConfig]] = {"gpt": GPTConfig, "llama": LlamaConfig}


def config_from_dict(data: dict[str, Any]) -> ModelConfig:
    """The inverse of ModelConfig.to_dict."""
    data = dict(data)
    family = data.pop("family", None)
    if family not in CONFIG_CLASSES:
        raise ValueError(f"unknown model family {family!r}; known: {sorted(CONFIG_CLASSES)}")
    return CONFIG_CLASSES[family](**data)
