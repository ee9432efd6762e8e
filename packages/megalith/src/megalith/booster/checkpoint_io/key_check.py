"""The keys and shapes of a model checkpoint against the model, before any tensor is read.

The index (or a single file's header) says which tensors the files hold and each file's
header their shapes, so every rank reaches the same verdict from the same few bytes and
raises before any collective of the load: under ZeRO a rank reads only the parameters
its shards hold, and a check made while reading would fail on one rank while the others
wait in the next gather. The rule is torch's load_state_dict(strict=...): with strict,
keys the model lacks ("unexpected") and keys the files lack ("missing") both fail, named.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from megalith_core.file_checks import check_safetensors
from megalith_core.safetensors_files import read_index

_SHOWN = 10


class CheckpointKeyError(KeyError, RuntimeError):
    """Keys of a checkpoint and of the model disagree (a KeyError, and a RuntimeError as
    torch's strict load raises)."""

    def __str__(self) -> str:
        return str(self.args[0])


def stored_shapes(directory: Path, prefix: str = "model") -> dict[str, tuple[int, ...]]:
    """Every tensor in directory's <prefix> files with its shape, from the headers only."""
    weight_map = read_index(directory, prefix)
    files = (
        [f"{prefix}.safetensors"]
        if weight_map is None
        else list(dict.fromkeys(weight_map.values()))
    )
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        header = check_safetensors(directory / name)
        shapes.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    if weight_map is not None:  # the index is what the files are read by
        shapes = {k: shapes[k] for k in weight_map if k in shapes}
    return shapes


def _names(keys: list[str]) -> str:
    shown = ", ".join(f'"{k}"' for k in keys[:_SHOWN])
    return shown + (f" ... ({len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else "")


def check_model_files(
    directory: Path,
    want: Mapping[str, tuple[int, ...] | None],
    *,
    strict: bool,
    known: Collection[str] = (),
    required: Collection[str] = (),
    aliases: Mapping[str, list[str]] | None = None,
    what: str = "the model",
    why_required: str = "",
) -> None:
    """Raises CheckpointKeyError / ValueError unless directory's model files fit `want`.

    want: the tensors the model loads, each with the full shape the files must hold (None:
    not checked); known: other names the model answers to (a tied parameter's second name);
    aliases: the names each tensor of want may be stored under (itself by default);
    required: names that must be there even without strict (ZeRO's parameters)."""
    stored = stored_shapes(directory)
    aliases = aliases or {}
    accepted = set(want) | set(known) | {a for names in aliases.values() for a in names}
    unexpected = [k for k in stored if k not in accepted]
    found = {k: next((a for a in aliases.get(k, [k]) if a in stored), None) for k in want}
    missing = [k for k, at in found.items() if at is None]
    if not strict:
        missing, unexpected = [k for k in missing if k in required], []
    if missing or unexpected:
        lines = [f"Error(s) in loading the checkpoint {directory} into {what}:"]
        if missing:
            lines.append(f"  Missing key(s) ({len(missing)}): {_names(missing)}.")
        if unexpected:
            lines.append(f"  Unexpected key(s) ({len(unexpected)}): {_names(unexpected)}.")
        fix = "A checkpoint of another model? Load the matching checkpoint"
        if strict:
            fix += ", or pass strict=False to skip keys that are in only one of them"
        if why_required and missing:
            fix += f" ({why_required})"
        raise CheckpointKeyError("\n".join([*lines, fix + "."]))
    wrong = [
        f"{k!r}: {list(stored[at])} in the files, {list(shape)} in the model"
        for k, shape in want.items()
        if shape is not None and (at := found[k]) is not None and stored[at] != tuple(shape)
    ]
    if wrong:
        raise ValueError(
            f"{directory}: shapes differ from {what}'s: {'; '.join(wrong[:_SHOWN])}: "
            "a checkpoint of another model (or of another configuration of it)"
        )
