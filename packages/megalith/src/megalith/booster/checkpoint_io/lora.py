"""save_lora_as_pretrained: a peft model's adapters in peft's own layout.

What peft's PeftModel.save_pretrained writes, per adapter (the "default" one in the
directory itself, any other in a sub-directory of its name): adapter_model.safetensors
(the adapter's weights under peft's key names) and adapter_config.json (its config,
with inference_mode set). The weights are the full ones: gathered by the plugin's
CheckpointIO as for a model save, so a tensor-parallel or ZeRO-sharded adapter is
written whole by rank 0 and loads with peft.PeftModel.from_pretrained.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from megalith_core.safetensors_files import TensorReader, atomic_save

from .base import UNCAPPED, CheckpointIO, is_writer


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ImportError(
            "save_lora_as_pretrained writes a peft adapter and needs peft: pip install peft"
        ) from None
    return peft


def full_tensors(io: CheckpointIO, model: Any) -> dict[str, torch.Tensor]:
    """The model's full tensors by name on the writer (collective): the I/O's own
    model_tensors where it has them, else its model files, read back."""
    own = getattr(io, "model_tensors", None)
    if callable(own):
        return {k: v.detach().cpu() for k, v in own(model).items()}
    staging = Path(tempfile.mkdtemp(prefix=".megalith-lora-"))
    try:
        io.write_model(model, staging, UNCAPPED)
        if not is_writer():
            return {}
        with TensorReader(staging, "model") as reader:
            return {k: reader.get(k) for k in reader.keys()}
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def save_lora_as_pretrained(
    io: CheckpointIO,
    model: Any,
    directory: Path,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    peft = _peft()
    if hasattr(model, "whole"):  # a pipelined model: the stages' whole module
        whole = io.whole_module(model)
    else:
        whole = model.unwrap(unwrap_peft=False) if hasattr(model, "unwrap") else model
    if not isinstance(whole, peft.PeftModel):
        raise ValueError(
            f"save_lora_as_pretrained: the model is a {type(whole).__name__}, not a peft "
            "PeftModel; add the adapters before boosting (booster.enable_lora(model, "
            "lora_config=...), or peft.get_peft_model(model, config)), or use save_model"
        )
    full = state_dict if state_dict is not None else full_tensors(io, model)
    if not is_writer():
        return
    full = _peft_names(whole, full)
    for name, config in whole.peft_config.items():
        out = directory if name == "default" else directory / name
        out.mkdir(parents=True, exist_ok=True)
        adapter = peft.get_peft_model_state_dict(whole, state_dict=full, adapter_name=name)
        atomic_save(adapter, out / "adapter_model.safetensors", metadata={"format": "pt"})
        config = copy.deepcopy(config)
        config.inference_mode = True
        config.save_pretrained(str(out))


def _peft_names(whole: Any, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors under the PeftModel's own names: the model files are keyed by the base
    model's names (what unwrap() gives), peft's adapter functions by the PeftModel's."""
    names = {n for n, _ in whole.named_parameters()}
    if names & set(full):
        return full
    base = whole.get_base_model()
    prefix = next((n + "." for n, m in whole.named_modules() if m is base and n), "")
    return {prefix + k: v for k, v in full.items()}
