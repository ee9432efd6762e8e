"""The one atomic writer every checkpoint file goes through.

A file is written under a temporary name in its own directory, fsynced, renamed
over the final name, and then the directory is fsynced so the rename itself is
on disk. A crash at any moment leaves the old file or the new one, never a torn
one, and no temporary file survives an error raised while writing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def temporary_name(path: Path) -> Path:
    """Where a write of `path` goes before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_directory(path: str | os.PathLike) -> None:
    """Makes the names in a directory (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        # Some filesystems (FUSE mounts, a few network ones) cannot fsync a directory
        # and say so; their renames are as durable as they get.
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def atomic_rename(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """os.replace, then the fsync of the directories whose names changed."""
    src, dst = Path(src), Path(dst)
    os.replace(src, dst)
    fsync_directory(dst.parent)
    if src.parent.resolve() != dst.parent.resolve():
        fsync_directory(src.parent)


def write_error(path: Path, error: BaseException) -> OSError:
    """An OSError naming the file a failed write was for, with the fix for a full disk.
    (safetensors' writer reports an OSError as its own error type, naming no file.)"""
    code = getattr(error, "errno", None)
    text = str(error)
    if code is None and ("No space left" in text or "StorageFull" in text):
        code = errno.ENOSPC
    if code in (errno.ENOSPC, errno.EDQUOT):
        fix = (
            f"the filesystem of {path.parent} is full (or over quota): free space there "
            "or write checkpoints to another directory"
        )
    else:
        fix = "check that the directory exists, is writable and is on a healthy disk"
    out = OSError(code or errno.EIO, f"writing {path} failed ({text}); {fix}")
    out.filename = str(path)
    return out


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields the temporary path to write `path`'s contents to (by any writer that takes
    a path); on a clean exit it becomes `path` durably, on an error it is removed."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        fsync_file(tmp)
        atomic_rename(tmp, path)
    except OSError as e:
        if getattr(e, "filename", None) == str(path):  # already names it
            raise
        raise write_error(path, e) from e
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent))
