"""Pretrained weights into a model built without them, one tensor at a time.

    with LazyInitContext():                       # or on the meta device
        model = LlamaForCausalLM(config)
    load_into(model, "ckpt/llama")                # each tensor read into its own storage

    model = from_pretrained("ckpt/llama")                          # a megalith.models model
    model = from_pretrained("ckpt/llama", library="transformers")  # AutoModelForCausalLM's

A parameter on the meta device (a LazyInitContext's, or one built under
torch.device("meta")) gets new storage on `device` in the parameter's dtype and the
file's bytes are read into it (files.py: no memory map, at most one staging tensor
when the dtype differs); the Parameter object stays the same (torch.utils.swap_tensors),
so ties and an optimizer built on the lazy model hold. A parameter with storage is
overwritten in place. Buffers the checkpoint does not hold (a rotary inv_freq) are
replayed from the lazy record alone (megalith.lazy.materialize_rest): nothing random is
drawn for a parameter the files fill. A peft model built on such a model (enable_lora
before or after booster.load_model) takes its base model's checkpoint: peft's names
are mapped back and its adapters left as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..lazy import is_lazy, materialize_rest
from ..lazy.context import LazyInitContext
from .files import CheckpointFiles
from .names import plan

_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _Slot:
    """One tensor of the module: its names and the (module, attribute) places holding it."""

    def __init__(self, tensor: torch.Tensor, is_param: bool) -> None:
        self.tensor, self.is_param = tensor, is_param
        self.names: list[str] = []
        self.places: list[tuple[torch.nn.Module, str]] = []


def _peft_view(module: torch.nn.Module) -> tuple[torch.nn.Module, Callable[[str], str | None]]:
    """The module whose tensors a checkpoint of the model fills, and the checkpoint's
    name of each of its tensors (None: not the checkpoint's). A peft model's: its base
    model, names without peft's "base_layer" step, its LoRA adapters none (a base
    model's files do not hold them); a modules_to_save head's original and its trainable
    copies (head.original_module.weight, head.modules_to_save.<adapter>.weight) both the
    head's own name, so the copy starts from the checkpoint as peft's copy of a loaded
    head does."""
    if not (hasattr(module, "get_base_model") and hasattr(module, "peft_config")):
        return module, lambda name: name

    def name_of(name: str) -> str | None:
        parts = name.split(".")
        if any(p.startswith("lora_") for p in parts):
            return None
        out, i = [], 0
        while i < len(parts):
            if parts[i] == "modules_to_save":  # and the adapter's name after it
                i += 2
                continue
            if parts[i] not in ("base_layer", "original_module"):
                out.append(parts[i])
            i += 1
        return ".".join(out)

    return module.get_base_model(), name_of


def _slots(module: torch.nn.Module) -> list[_Slot]:
    module, name_of = _peft_view(module)
    slots: dict[int, _Slot] = {}
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for is_param, table in ((True, owner._parameters), (False, owner._buffers)):
            for attr, t in table.items():
                if t is None:
                    continue
                name = name_of(f"{prefix}.{attr}" if prefix else attr)
                if name is None:
                    continue
                slot = slots.setdefault(id(t), _Slot(t, is_param))
                if name not in slot.names:
                    slot.names.append(name)
                    slot.places.append((owner, attr))
    return list(slots.values())


def _put(slot: _Slot, value: torch.Tensor) -> None:
    """value in the place of slot's meta tensor, the same object where torch allows."""
    t = slot.tensor
    new = torch.nn.Parameter(value, requires_grad=t.requires_grad) if slot.is_param else value
    try:
        torch.utils.swap_tensors(t, new)
    except RuntimeError:  # something holds a weak reference (torch's RNNs): set it anew
        for owner, attr in slot.places:
            (owner._parameters if slot.is_param else owner._buffers)[attr] = new


def fit(
    module: torch.nn.Module, files: CheckpointFiles, directory: Any, strict: bool
) -> tuple[list[_Slot], dict[int, str]]:
    """module's tensors (slots) and {slot index: the file tensor that fills it}; with
    strict, refuses a checkpoint that leaves a parameter or persistent buffer unfilled
    or holds a tensor with no place."""
    slots = _slots(module)
    base, name_of = _peft_view(module)
    persistent = {name_of(k) for k in base.state_dict(keep_vars=True)}
    found, unused = plan([s.names for s in slots], files.keys())
    missing = [
        s.names[0]
        for i, s in enumerate(slots)
        if i not in found and (s.is_param or s.names[0] in persistent)
    ]
    if strict and (missing or unused):
        raise ValueError(
            f"{directory}: the checkpoint does not fit this {type(module).__name__}: "
            f"{len(missing)} of its tensors are not in the files {missing[:4]}, "
            f"{len(unused)} file tensors have no place in it {unused[:4]}; load the "
            "checkpoint of this model (or its config), or pass strict=False"
        )
    return slots, found


def load_into(
    module: torch.nn.Module,
    directory: str | os.PathLike,
    *,
    strict: bool = True,
    device: torch.device | str = "cpu",
) -> torch.nn.Module:
    """Fills module's parameters and persistent buffers from a safetensors checkpoint (a
    directory with model.safetensors or an index and its shards, an index json, or one
    file); returns module. strict: every parameter must be in the files and every file
    tensor must have a place. Parameters the files do not fill (strict=False) keep their
    values, or, when lazy, are replayed from their record."""
    device = torch.device(device)
    with CheckpointFiles(directory) as files:
        slots, found = fit(module, files, directory, strict)
        for i, slot in enumerate(slots):
            key = found.get(i)
            if key is None:
                continue
            t = slot.tensor
            if t.is_meta:
                value = torch.empty(t.shape, dtype=t.dtype, device=device)
                files.read_into(key, value)
                _put(slot, value)
            else:
                files.read_into(key, t.detach())
    if is_lazy(module):
        materialize_rest(module)
    left = [s.names[0] for s in _slots(module) if s.tensor.is_meta]
    if left:
        raise ValueError(
            f"load_into: {left[:4]} ({len(left)} in all) are still on the meta device: the "
            "checkpoint does not hold them and a model built under torch.device('meta') has "
            "no record of how to compute them; build it inside megalith.lazy.LazyInitContext"
        )
    return module


def _dtype(config: dict[str, Any], dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32  # as transformers' from_pretrained before 5 (and megalith's fp32)
    if dtype == "auto":
        name = config.get("dtype") or config.get("torch_dtype") or "float32"
        return _DTYPE_NAMES.get(name, torch.float32)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"from_pretrained: dtype={dtype!r}; pass a torch.dtype, 'auto' or None")
    return dtype


def from_pretrained(
    directory: str | os.PathLike,
    *,
    library: str = "megalith",
    dtype: torch.dtype | str | None = None,
    device: torch.device | str = "cpu",
    strict: bool = True,
) -> torch.nn.Module:
    """A model built on the meta device and filled from a transformers directory
    (config.json plus safetensors), tensor by tensor. library="megalith": a
    megalith.models GPT or Llama (gpt2 and plain-RoPE llama configs);
    "transformers": AutoModelForCausalLM's class for the config. In eval mode, as
    transformers gives it (call .train() before training with dropout). dtype: None (float32), "auto" (config.json's) or a dtype."""
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path}: no config.json; from_pretrained reads a directory transformers' "
            "save_pretrained wrote (for weights alone use load_into(model, directory))"
        )
    config = json.loads((path / "config.json").read_text())
    dtype = _dtype(config, dtype)
    if library == "megalith":
        from ..models import create
        from ..models.hf import from_hf_config

        model = create(from_hf_config(config, name=path.name), device="meta", dtype=dtype)
        return load_into(model, path, strict=strict, device=device).eval()
    if library == "transformers":
        try:
            import transformers
        except ImportError:
            raise ImportError(
                "from_pretrained(library='transformers') needs transformers: "
                "pip install transformers"
            ) from None
        hf_config = transformers.AutoConfig.from_pretrained(str(path))
        with LazyInitContext(default_device=device):
            model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
        return load_into(model, path, strict=strict, device=device).eval()
    raise ValueError(f"from_pretrained: library={library!r}; expected 'megalith' or 'transformers'")
