"""A safetensors checkpoint (one file, or shards named by an index json) read one
tensor at a time with plain reads, never memory-mapped.

[Note: why not mmap]
safetensors' own reader maps each file: every page a tensor touches stays in the
process's resident set while the file is open, so loading a 13B checkpoint shows
26 GB of RSS however little of it the rank keeps. Here a tensor's bytes are read
(readinto) straight into the tensor that keeps them when dtype and layout agree, or
into one staging tensor that is cast into it: host memory grows by what the rank
keeps plus at most one tensor.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from megalith_core.file_checks import DamagedCheckpointError

#: safetensors' dtype names
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
#: one read() call moves at most this much (Linux caps a read near 2 GiB)
_READ_BYTES = 1 << 30


@dataclass(frozen=True)
class Entry:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int


def _files_of(path: Path) -> list[Path]:
    """The safetensors files of a directory, an index json or one file."""
    if path.is_file() and path.name.endswith(".index.json"):
        index = path
    elif path.is_file():
        return [path]
    else:
        index = path / "model.safetensors.index.json"
        if not index.is_file():
            single = path / "model.safetensors"
            if single.is_file():
                return [single]
            raise FileNotFoundError(
                f"{path}: neither model.safetensors.index.json nor model.safetensors; pass the "
                "directory that transformers' save_pretrained (or booster.save_model) wrote"
            )
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedCheckpointError(index, f"not a readable index ({e!r})") from None
    names = list(dict.fromkeys(weight_map.values()))
    for name in names:
        if Path(name).name != name:
            raise DamagedCheckpointError(index, f"the index names {name!r}, not a file beside it")
    return [index.parent / n for n in names]


def _header(file: Path) -> dict[str, Any]:
    try:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 << 20:
                raise ValueError(f"a header of {n} bytes")
            return json.loads(f.read(n)) | {"__data_start__": 8 + n}
    except FileNotFoundError:
        raise DamagedCheckpointError(file, "the file is missing") from None
    except (struct.error, ValueError) as e:
        raise DamagedCheckpointError(file, f"not a readable safetensors file ({e})") from None


class CheckpointFiles:
    """The tensors of a checkpoint by name: shape, dtype, and read / read_into."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.entries: dict[str, Entry] = {}
        for file in _files_of(self.path):
            header = _header(file)
            start = header.pop("__data_start__")
            header.pop("__metadata__", None)
            size = file.stat().st_size
            for name, h in header.items():
                if h["dtype"] not in DTYPES:
                    raise ValueError(
                        f"{file}: {name!r} is {h['dtype']}, which megalith cannot load"
                    )
                begin, end = (start + o for o in h["data_offsets"])
                dtype, shape = DTYPES[h["dtype"]], tuple(h["shape"])
                want = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
                if end - begin != want or end > size:
                    raise DamagedCheckpointError(
                        file, f"{name!r} spans {end - begin} bytes, its shape needs {want}"
                    )
                self.entries[name] = Entry(file, dtype, shape, begin, end)
        self._open: dict[Path, BinaryIO] = {}

    def __enter__(self) -> CheckpointFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()

    def keys(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def nbytes(self) -> int:
        return sum(e.end - e.begin for e in self.entries.values())

    def _read_bytes(self, entry: Entry, out: torch.Tensor) -> None:
        """entry's bytes into out (a contiguous CPU uint8 tensor of the right size)."""
        f = self._open.get(entry.file)
        if f is None:
            f = self._open[entry.file] = open(entry.file, "rb", buffering=0)
        view = memoryview(out.numpy()).cast("B")
        f.seek(entry.begin)
        done = 0
        while done < len(view):
            n = f.readinto(view[done : done + _READ_BYTES])
            if not n:
                raise DamagedCheckpointError(entry.file, "the file ends inside a tensor")
            done += n

    def read_into(self, name: str, dest: torch.Tensor) -> None:
        """The tensor name, cast to dest's dtype, into dest (any device and layout)."""
        entry = self.entries[name]
        if tuple(dest.shape) != entry.shape:
            raise ValueError(
                f"{self.path}: {name!r} has shape {list(entry.shape)}, the model "
                f"{list(dest.shape)}: a checkpoint of another model (or another config)"
            )
        if dest.numel() == 0:
            return
        direct = dest.device.type == "cpu" and dest.dtype == entry.dtype and dest.is_contiguous()
        if direct:  # the bytes land where they are kept: no copy at all
            self._read_bytes(entry, dest.detach().view(-1).view(torch.uint8))
            return
        staging = torch.empty(entry.end - entry.begin, dtype=torch.uint8)
        self._read_bytes(entry, staging)
        with torch.no_grad():
            dest.copy_(staging.view(entry.dtype).view(entry.shape))

    def read(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor name as a new CPU tensor (in dtype, default the file's)."""
        entry = self.entries[name]
        out = torch.empty(entry.shape, dtype=dtype or entry.dtype)
        self.read_into(name, out)
        return out
