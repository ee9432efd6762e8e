"""config.json and generation_config.json beside a sharded save, as transformers'
save_pretrained writes them, so `AutoModel*.from_pretrained(directory)` builds the model
that was saved (without it, transformers builds a default config: for Llama, 7B).

For a transformers PreTrainedModel (peft's wrapper unwrapped): its config with
`architectures` set to the model's class and the dtype set to the dtype the weights
were written in (from the files themselves: ZeRO writes its fp32 masters); and its
generation config when the model can generate. megalith's own reference models give
theirs through `to_hf_config()`. The user's config object is never changed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from megalith_core.atomic_files import atomic_write_text
from megalith_core.safetensors_files import atomic_json

from .safetensors_join import read_header

_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def unwrap_peft(module: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a peft PeftModel (itself otherwise)."""
    get_base = getattr(module, "get_base_model", None)
    return get_base() if callable(get_base) and hasattr(module, "peft_config") else module


def written_dtype(directory: Path) -> str | None:
    """The dtype of the first floating tensor in directory's model files."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = list(dict.fromkeys(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        if (directory / name).is_file():
            header, _ = read_header(directory / name)
            for key, entry in header.items():
                if key != "__metadata__" and entry["dtype"] in _DTYPES:
                    return _DTYPES[entry["dtype"]]
    return None


def pretrained_model(module: torch.nn.Module) -> Any:
    """module as a transformers PreTrainedModel, or None."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    model = unwrap_peft(module)
    return model if isinstance(model, PreTrainedModel) else None


def config_writer(module: torch.nn.Module) -> Callable[[Path], None] | None:
    """What writes module's config.json (and generation_config.json) into a directory of
    its weights, with the configs copied now (the writing may come later, from the
    background thread of an asynchronous save); None for a model without a config."""
    to_hf = getattr(module, "to_hf_config", None)
    if callable(to_hf):  # megalith's reference models
        hf = to_hf()
        return lambda directory: atomic_json(hf, directory / "config.json")
    model = pretrained_model(module)
    if model is None:
        return None
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    generation = getattr(model, "generation_config", None)
    generation = (
        copy.deepcopy(generation) if generation is not None and model.can_generate() else None
    )

    def write(directory: Path) -> None:
        dtype = written_dtype(directory)
        if dtype is not None:
            setattr(config, "dtype" if hasattr(config, "dtype") else "torch_dtype", dtype)
        atomic_write_text(directory / "config.json", config.to_json_string(use_diff=True))
        if generation is not None:
            text = generation.to_json_string(use_diff=True)
            atomic_write_text(directory / "generation_config.json", text)

    return write
