"""Joining safetensors files into one without loading their tensors.

A safetensors file is an 8-byte little-endian header length, a JSON header (each
tensor's dtype, shape and byte range in the data section, plus an optional
"__metadata__" of strings), and the data section. Joining files is therefore a new
header with the byte ranges shifted, followed by each file's data section copied as
bytes. An unsharded save uses it to turn the files a sharded writer produced (ZeRO's
parameters plus buffers.safetensors, say) into the one file the user asked for, and
to carry an optimizer's optimizer.json inside its single file as metadata.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from megalith_core.atomic_files import atomic_path

#: the metadata key under which a single-file optimizer checkpoint carries optimizer.json
OPTIMIZER_META = "megalith.optimizer"


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """A file's header and where its data section starts."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def read_metadata(path: Path) -> dict[str, str]:
    return read_header(path)[0].get("__metadata__") or {}


def join(sources: list[Path], dst: Path, metadata: dict[str, str] | None = None) -> None:
    """One file at dst (written atomically) holding every tensor of sources, with their
    metadata merged and `metadata` added."""
    header: dict[str, Any] = {}
    meta: dict[str, str] = {}
    spans: list[tuple[Path, int, int]] = []
    offset = 0
    for src in sources:
        h, start = read_header(src)
        meta.update(h.pop("__metadata__", None) or {})
        size = max((v["data_offsets"][1] for v in h.values()), default=0)
        for key, entry in h.items():
            if key in header:
                raise ValueError(f"joining {sources}: tensor {key!r} is in two files")
            lo, hi = entry["data_offsets"]
            header[key] = {**entry, "data_offsets": [lo + offset, hi + offset]}
        spans.append((src, start, size))
        offset += size
    meta.update(metadata or {})
    if meta:
        header["__metadata__"] = meta
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    with atomic_path(dst) as tmp, open(tmp, "wb") as out:
        out.write(struct.pack("<Q", len(blob)))
        out.write(blob)
        for src, start, size in spans:
            with open(src, "rb") as f:
                f.seek(start)
                _copy(f, out, size)


def _copy(src: Any, dst: Any, nbytes: int) -> None:
    left = nbytes
    while left:
        chunk = src.read(min(left, 64 << 20))
        if not chunk:
            raise OSError(f"{src.name}: ended {left} bytes early")
        dst.write(chunk)
        left -= len(chunk)
