"""transformers interchange: config.json both ways, and directories that
`AutoModelForCausalLM.from_pretrained` loads (config.json plus model.safetensors,
or shards plus model.safetensors.index.json).

Our parameter names and layouts are transformers' own, so a state dict needs no
conversion; only a tied output projection is left out of the files, as
transformers does (safetensors refuses two names for one storage).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from megalith_core.atomic_files import atomic_write_json
from megalith_core.safetensors_files import atomic_save

from .base import CausalLM
from .config import GPTConfig, LlamaConfig, ModelConfig

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def to_hf_config(config: ModelConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """config.json content for GPT2LMHeadModel or LlamaForCausalLM."""
    common = {"vocab_size": config.vocab_size, "tie_word_embeddings": config.tie_word_embeddings}
    common["initializer_range"] = config.initializer_range
    common["torch_dtype"] = _DTYPE_NAMES.get(dtype, "float32")
    if isinstance(config, GPTConfig):
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            **common,
            "n_positions": config.max_seq_len,
            "n_embd": config.d_model,
            "n_layer": config.n_layers,
            "n_head": config.n_heads,
            "n_inner": config.d_ff,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": config.norm_eps,
            "resid_pdrop": config.dropout,
            "embd_pdrop": config.dropout,
            "attn_pdrop": config.dropout,
            "scale_attn_weights": True,
            # GPT-2's <|endoftext|>, kept inside smaller test vocabularies.
            "bos_token_id": min(50256, config.vocab_size - 1),
            "eos_token_id": min(50256, config.vocab_size - 1),
        }
    if isinstance(config, LlamaConfig):
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **common,
            "hidden_size": config.d_model,
            "intermediate_size": config.d_ff,
            "num_hidden_layers": config.n_layers,
            "num_attention_heads": config.n_heads,
            "num_key_value_heads": config.num_kv_heads,
            "head_dim": config.head_dim,
            "max_position_embeddings": config.max_seq_len,
            "hidden_act": "silu",
            "rms_norm_eps": config.norm_eps,
            # transformers < 5 reads rope_theta/rope_scaling, 5 reads rope_parameters.
            "rope_theta": config.rope_theta,
            "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "attention_bias": False,
            "mlp_bias": False,
        }
    raise TypeError(f"no transformers mapping for {type(config).__name__}")


def from_hf_config(hf: dict[str, Any], name: str = "custom") -> ModelConfig:
    """The ModelConfig for a transformers config.json (gpt2 or llama model_type)."""
    model_type = hf.get("model_type")
    if model_type == "gpt2":
        if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported GPT-2 activation {hf['activation_function']!r}")
        return GPTConfig(
            name=name,
            vocab_size=hf["vocab_size"],
            max_seq_len=hf["n_positions"],
            d_model=hf["n_embd"],
            n_layers=hf["n_layer"],
            n_heads=hf["n_head"],
            d_ff=hf.get("n_inner") or 4 * hf["n_embd"],
            tie_word_embeddings=hf.get("tie_word_embeddings", True),
            initializer_range=hf.get("initializer_range", 0.02),
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            dropout=hf.get("resid_pdrop", 0.0),
        )
    if model_type == "llama":
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"unsupported RoPE scaling {rope!r}: megalith has plain RoPE only")
        heads = hf["num_attention_heads"]
        if hf.get("head_dim") not in (None, hf["hidden_size"] // heads):
            raise ValueError(f"unsupported head_dim {hf['head_dim']} != hidden_size / heads")
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ValueError("unsupported Llama with attention or MLP biases")
        return LlamaConfig(
            name=name,
            vocab_size=hf["vocab_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048),
            d_model=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=hf.get("num_key_value_heads") or heads,
            d_ff=hf["intermediate_size"],
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            initializer_range=hf.get("initializer_range", 0.02),
            norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        )
    raise ValueError(f"unsupported model_type {model_type!r}: megalith has gpt2 and llama")


def hf_state_dict(model: CausalLM) -> dict[str, torch.Tensor]:
    """model.state_dict() without the tied copies, every tensor contiguous, on CPU."""
    tied = set(model.tied_weights)
    return {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in model.state_dict().items()
        if name not in tied
    }


def save_pretrained(
    model: CausalLM, directory: str | os.PathLike, max_shard_bytes: int | None = None
) -> Path:
    """Writes config.json and the weights (sharded with an index past max_shard_bytes).

    Each file is written atomically (megalith_core.atomic_files), the index last, so a
    crash mid-save never leaves a file half written; a folder saved over an older one
    can still mix files of both until the index lands.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    state = hf_state_dict(model)
    dtype = next(iter(state.values())).dtype
    atomic_write_json(path / "config.json", to_hf_config(model.config, dtype), indent=2)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        atomic_save(shards[0], path / "model.safetensors", metadata={"format": "pt"})
        return path
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        atomic_save(shard, path / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    atomic_write_json(path / "model.safetensors.index.json", index, indent=2)
    return path


def load_pretrained(directory: str | os.PathLike, device: torch.device | str = "cpu") -> CausalLM:
    """A megalith model from a transformers directory (gpt2 or llama, safetensors weights),
    in the dtype of its files: built on the meta device and filled one tensor at a time
    (megalith.pretrained); the original GPT-2 files' names without "transformer." load too."""
    from ..pretrained import from_pretrained
    from ..pretrained.files import CheckpointFiles

    with CheckpointFiles(directory) as files:
        dtypes = [e.dtype for e in files.entries.values() if e.dtype.is_floating_point]
    model = from_pretrained(
        directory, library="megalith", dtype=dtypes[0] if dtypes else None, device=device
    )
    return model.train()  # as create() gives it
