"""The layout-free optimizer checkpoint: per parameter name, full fp32 tensors.

    <dir>/optimizer.json                      format, kind, param groups, per-parameter
                                              group and step count, loss scale
    <dir>/optimizer[-0000i-of-0000n].safetensors   "<param name>::<state>" tensors
    <dir>/optimizer.safetensors.index.json

Nothing in it depends on the world size, the plugin or the parallel layout, so a
checkpoint written under one loads under any other. The writers are the Booster's
checkpoint I/O and megalith_zero.full_optimizer; this module is the format they share.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .safetensors_files import atomic_json

FORMAT = 1
SEP = "::"
META = "optimizer.json"


def state_key(param_name: str, state: str) -> str:
    return f"{param_name}{SEP}{state}"


def hyperparameters(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The param groups without their parameters, as optimizer.json holds them."""
    return [{k: v for k, v in g.items() if k != "params"} for g in groups]


def write_meta(
    path: Path,
    kind: str,
    groups: list[dict[str, Any]],
    params: dict[str, dict[str, int]],
    loss_scale: dict[str, Any] | None,
    **extra: Any,
) -> None:
    """optimizer.json; written last, so a directory without it is an unfinished save."""
    meta = {
        "format": FORMAT,
        "kind": kind,
        "param_groups": hyperparameters(groups),
        "params": params,
        "loss_scale": loss_scale,
        **extra,
    }
    atomic_json(meta, path / META)


def read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / META
    if not meta_path.exists():
        raise FileNotFoundError(
            f"{path}: no {META} (not a megalith optimizer checkpoint, or an unfinished one)"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"{meta_path}: format {meta.get('format')}; this megalith reads format {FORMAT}"
        )
    return meta


def restore_hyperparameters(groups: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Puts the saved hyperparameters back into live param groups (json lists become tuples)."""
    for group, saved in zip(groups, meta["param_groups"]):
        for key, value in saved.items():
            group[key] = tuple(value) if isinstance(value, list) else value
