"""CheckpointIndexFile: ColossalAI's object for the index json of a sharded checkpoint.

The json is transformers' (and megalith's) layout: {"metadata": {...}, "weight_map":
{tensor name: file name}}, the file names relative to the index's directory. An
optimizer index of ColossalAI's names its param-group file under metadata
"param_groups". "Distributed tensor" files (a name ending in ".*.safetensors" or
".*.bin") are ColossalAI's; megalith never writes them, and they are listed apart.
Written atomically, as every megalith checkpoint file.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from megalith_core.atomic_files import atomic_write_text
from megalith_core.safetensors_files import shard_path


def is_dtensor_checkpoint(name: str) -> bool:
    return name.endswith((".*.safetensors", ".*.bin"))


class CheckpointIndexFile:
    """The metadata and weight map of one index json, rooted at its directory."""

    def __init__(self, root_path: str | os.PathLike | None = None) -> None:
        self.root_path = Path(root_path) if root_path is not None else None
        self.metadata: dict[str, Any] = OrderedDict()
        self.weight_map: dict[str, str] = OrderedDict()
        self._index_path: Path | None = None

    @staticmethod
    def from_file(index_path: str | os.PathLike) -> CheckpointIndexFile:
        index = CheckpointIndexFile()
        index.load(index_path)
        return index

    def load(self, json_path: str | os.PathLike) -> None:
        """Reads an index json; its directory becomes the root of the files it names."""
        data = json.loads(Path(json_path).read_text())
        self.metadata = OrderedDict(data.get("metadata", {}))
        self.weight_map = OrderedDict(data.get("weight_map", {}))
        self.root_path = Path(json_path).absolute().parent
        self._index_path = Path(json_path)

    def _json(self) -> str:
        return json.dumps({"metadata": self.metadata, "weight_map": self.weight_map}, indent=2)

    def export(self, json_path: str | os.PathLike) -> None:
        """Writes the index to json_path (as given, not under the root)."""
        atomic_write_text(Path(json_path), self._json() + "\n")

    def write_index_file(self, save_index_file: str | os.PathLike) -> None:
        """Writes the index as save_index_file under the root directory."""
        root = self.root_path if self.root_path is not None else Path.cwd()
        atomic_write_text(root / save_index_file, self._json() + "\n")

    def append_weight_map(self, param_name: str, shard_file: str) -> None:
        self.weight_map[param_name] = shard_file

    def append_meta_data(self, name: str, val: Any) -> None:
        self.metadata[name] = val

    def contains_dtensor(self) -> bool:
        return any(is_dtensor_checkpoint(f) for f in self.weight_map.values())

    def _root(self) -> Path:
        if self.root_path is None:
            raise ValueError(
                "CheckpointIndexFile has no root directory: build it with "
                "CheckpointIndexFile(root_path) or CheckpointIndexFile.from_file(path)"
            )
        return Path(self.root_path)

    def _index(self) -> Path:
        """The index file, for errors (its would-be path when built in memory)."""
        return self._index_path or self._root() / "index.json"

    def get_checkpoint_filenames(self) -> tuple[list[str], list[str]]:
        """(the shard files, the distributed-tensor files): absolute paths, each once, sorted;
        an entry leading out of the root directory is refused (shard_path)."""
        root = self._root()
        names = sorted(set(self.weight_map.values()))
        files = [str(shard_path(root, f, self._index())) for f in names]
        return (
            [f for f in files if not is_dtensor_checkpoint(f)],
            [f for f in files if is_dtensor_checkpoint(f)],
        )

    def assert_no_dtensor_checkpoint(self) -> None:
        for f in self.weight_map.values():
            if is_dtensor_checkpoint(f):
                raise ValueError(f"checkpoint file {f} holds distributed tensors")

    def get_checkpoint_file(self, param_name: str) -> str:
        """The file (relative to the root) holding param_name."""
        return self.weight_map[param_name]

    def get_all_param_names(self) -> list[str]:
        return list(self.weight_map)

    def get_param_group_filename(self) -> str | None:
        """The absolute path of an optimizer index's param-group file, or None."""
        name = self.metadata.get("param_groups")
        return str(shard_path(self._root(), name, self._index())) if name else None
