"""booster.load_model into a model not boosted yet, under a plugin that shards it a
chunk at a time (GeminiPlugin, LowLevelZeroPlugin): the checkpoint is checked against
the model now (names, shapes: the errors of load_into) and read at boost, each chunk's
tensors straight from the files into it as it is sharded
(megalith.lazy.ChunkMaterializer(checkpoint=...)), so no rank reads, or holds, the
whole model. Until boost the model's parameters stay lazy (on the meta device).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .files import CheckpointFiles
from .load import fit

_ATTR = "_megalith_pending_load"


@dataclass(frozen=True)
class PendingLoad:
    directory: str
    strict: bool


def defer_load(module: torch.nn.Module, directory: str | os.PathLike, strict: bool) -> None:
    """Checks the checkpoint fits module (raising as load_into does) and records it for
    boost to read."""
    with CheckpointFiles(directory) as files:
        slots, found = fit(module, files, directory, strict)
        for i, key in found.items():  # shapes now, not in the middle of boost
            want, got = files.entries[key].shape, tuple(slots[i].tensor.shape)
            if want != got:
                raise ValueError(
                    f"{directory}: {key!r} has shape {list(want)}, the model {list(got)}: "
                    "a checkpoint of another model (or another config)"
                )
    setattr(module, _ATTR, PendingLoad(str(directory), strict))


def _holder(module: torch.nn.Module) -> torch.nn.Module:
    """module, or the base model of a peft model built on it after load_model."""
    if _ATTR not in vars(module) and hasattr(module, "get_base_model"):
        if hasattr(module, "peft_config"):
            return module.get_base_model()
    return module


def pending_load(module: torch.nn.Module) -> PendingLoad | None:
    """The checkpoint defer_load recorded on module (or on the model a peft model
    wraps), or None."""
    return vars(_holder(module)).get(_ATTR)


def take_pending_load(module: torch.nn.Module) -> PendingLoad | None:
    """pending_load, forgotten (boost reads it once)."""
    holder = _holder(module)
    pending = vars(holder).get(_ATTR)
    if pending is not None:
        delattr(holder, _ATTR)
    return pending
