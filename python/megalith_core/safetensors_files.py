"""safetensors files written atomically (megalith_core.atomic_files), and a writer that
streams tensors into size-capped files with an index json (the layout transformers reads)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .atomic_files import atomic_path, atomic_write_json, write_error
from .file_checks import DamagedCheckpointError, check_safetensors


def _st():
    try:
        import safetensors.torch as st
        from safetensors import safe_open
    except ImportError:
        raise ImportError(
            "megalith checkpoints need safetensors: pip install safetensors"
        ) from None
    return st, safe_open


def safe_open(path: str | os.PathLike) -> Any:
    """safetensors' reader, whose errors about a malformed file name the file."""
    try:
        return _st()[1](str(path), framework="pt")
    except FileNotFoundError:
        raise DamagedCheckpointError(path, "the file is missing") from None
    except Exception as e:
        if type(e).__name__ != "SafetensorError":
            raise
        check_safetensors(Path(path))  # says what is wrong, in sizes
        raise DamagedCheckpointError(path, f"not a readable safetensors file ({e})") from None


def atomic_save(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    st, _ = _st()
    with atomic_path(path) as tmp:
        contiguous = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        try:
            st.save_file(contiguous, str(tmp), metadata=metadata)
        except Exception as e:
            if type(e).__name__ != "SafetensorError":
                raise
            raise write_error(path, e) from e


def atomic_json(obj: Any, path: Path) -> None:
    atomic_write_json(path, obj, indent=1)


class StreamedFiles:
    """Writes tensors, in a known order and size, into files of at most max_bytes each.

    plan: (key, nbytes) in the order add() will be called. A file is written the
    moment its last tensor arrives, so at most one file's tensors are held.
    `prefix` "model" gives model.safetensors or model-00001-of-00003.safetensors...
    and model.safetensors.index.json.
    """

    def __init__(
        self, path: Path, prefix: str, plan: Sequence[tuple[str, int]], max_bytes: int, write: bool
    ):
        self.path, self.prefix, self.write = path, prefix, write
        groups: list[list[str]] = [[]]
        size = 0
        for key, nbytes in plan:
            if groups[-1] and size + nbytes > max_bytes:
                groups.append([])
                size = 0
            groups[-1].append(key)
            size += nbytes
        n = len(groups)
        names = (
            [f"{prefix}.safetensors"]
            if n == 1
            else [f"{prefix}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        )
        self.file_of = {k: names[i] for i, g in enumerate(groups) for k in g}
        self._left = {names[i]: len(g) for i, g in enumerate(groups)}
        self._pending: dict[str, dict[str, torch.Tensor]] = {}
        self.total_bytes = sum(nbytes for _, nbytes in plan)
        if write:
            path.mkdir(parents=True, exist_ok=True)

    def add(self, key: str, tensor: torch.Tensor) -> None:
        if not self.write:
            return
        f = self.file_of[key]
        self._pending.setdefault(f, {})[key] = tensor
        self._left[f] -= 1
        if self._left[f] == 0:
            atomic_save(self._pending.pop(f), self.path / f, metadata={"format": "pt"})

    def finish(self, extra: dict[str, str] | None = None) -> None:
        if not self.write:
            return
        index = {
            "metadata": {"total_size": self.total_bytes},
            "weight_map": {**self.file_of, **(extra or {})},
        }
        atomic_json(index, self.path / f"{self.prefix}.safetensors.index.json")


def read_index_file(index: Path, directory: Path | None = None) -> dict[str, str]:
    """key -> file of an index json, every file checked to lie inside directory (by
    default the index's own; shard_path)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except FileNotFoundError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedCheckpointError(index, f"not a readable index ({e!r})") from None
    for name in dict.fromkeys(weight_map.values()):
        shard_path(directory or index.parent, name, index)
    return weight_map


def read_index(path: Path, prefix: str) -> dict[str, str] | None:
    """key -> file from <prefix>.safetensors.index.json; None when there is a single
    <prefix>.safetensors; FileNotFoundError when neither exists."""
    index = path / f"{prefix}.safetensors.index.json"
    if index.exists():
        return read_index_file(index, path)
    if (path / f"{prefix}.safetensors").exists():
        return None
    raise FileNotFoundError(
        f"{path}: neither {prefix}.safetensors.index.json nor {prefix}.safetensors"
    )


def shard_path(directory: Path, name: str, index: Path) -> Path:
    """directory / name for a file an index names, refused when it is not a plain name
    inside the checkpoint: absolute, with "..", or (a link) resolving outside both the
    directory and the directory of the index's own real file (a transformers cache links
    each file to its blob beside the index's)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{index}: a weight_map entry {name!r} is not a file name")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(
            f"{index}: the weight_map entry {name!r} leads out of the checkpoint directory; "
            "an index may only name files inside its directory (a tampered or foreign "
            "index: rewrite the entry as a bare file name)"
        )
    target = (directory / rel).resolve()
    roots = {directory.resolve(), index.resolve().parent}
    if not any(target.is_relative_to(root) for root in roots):
        raise ValueError(
            f"{index}: the weight_map entry {name!r} is a link to {target}, outside the "
            "checkpoint directory; copy the file into the checkpoint instead of linking it"
        )
    return directory / rel


class TensorReader:
    """Reads tensors by key from an index (or single file), opening files lazily."""

    def __init__(self, path: Path, prefix: str):
        self.path, self.prefix = path, prefix
        self.weight_map = read_index(path, prefix)
        self._open: dict[str, Any] = {}

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self._open.values():
            f.__exit__(None, None, None)
        self._open.clear()

    def keys(self) -> list[str]:
        if self.weight_map is not None:
            return list(self.weight_map)
        return list(self._file(f"{self.prefix}.safetensors").keys())

    def _file(self, name: str) -> Any:
        if name not in self._open:
            self._open[name] = safe_open(self.path / name).__enter__()
        return self._open[name]

    def has(self, key: str) -> bool:
        return key in self.keys() if self.weight_map is None else key in self.weight_map

    def get(self, key: str) -> torch.Tensor:
        name = (
            self.weight_map.get(key)
            if self.weight_map is not None
            else f"{self.prefix}.safetensors"
        )
        if name is None:
            raise KeyError(f"{self.path}: no tensor {key!r}")
        return self._file(name).get_tensor(key)


def write_tensors(
    path: Path, prefix: str, tensors: dict[str, torch.Tensor], max_bytes: int, write: bool
) -> None:
    """Tensors already in memory as StreamedFiles' files and index, in their order."""
    plan = [(k, t.numel() * t.element_size()) for k, t in tensors.items()]
    out = StreamedFiles(path, prefix, plan, max_bytes, write=write)
    for key, tensor in tensors.items():
        out.add(key, tensor)
    out.finish()
