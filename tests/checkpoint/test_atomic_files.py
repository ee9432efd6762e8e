"""megalith_core.atomic_files: every checkpoint file is fsynced under a temporary name,
renamed into place, and its directory fsynced after the rename; an error leaves the old
file and no temporary one. The safetensors and json writers of the file format go
through it."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from megalith_core import atomic_files
from megalith_core.optimizer_files import read_meta, write_meta
from megalith_core.safetensors_files import StreamedFiles, TensorReader, atomic_save


@pytest.fixture
def fsyncs(monkeypatch):
    """(path fsynced, whether it was a directory, the names in that directory then)."""
    calls: list[tuple[Path, bool, set[str]]] = []
    real = os.fsync

    def record(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        folder = path if path.is_dir() else path.parent
        calls.append((path, path.is_dir(), set(os.listdir(folder))))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return calls


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if ".tmp" in p.name]


def check_committed(fsyncs, path: Path) -> None:
    """The file's data was fsynced before it had its name, and its directory after."""
    files = [i for i, (p, is_dir, _) in enumerate(fsyncs) if not is_dir and p.parent == path.parent]
    dirs = [i for i, (p, is_dir, names) in enumerate(fsyncs) if is_dir and p == path.parent]
    assert files, f"{path}'s data was never fsynced"
    assert any(path.name not in fsyncs[i][2] for i in files), "fsynced only under its own name"
    assert any(path.name in fsyncs[i][2] and i > files[0] for i in dirs), (
        f"{path.parent} was not fsynced after the rename"
    )


def test_text_is_fsynced_renamed_and_its_directory_fsynced(tmp_path, fsyncs):
    target = tmp_path / "latest"
    atomic_files.atomic_write_text(target, "step_000010")
    assert target.read_text() == "step_000010"
    assert leftovers(tmp_path) == []
    check_committed(fsyncs, target)


def test_an_error_while_writing_keeps_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "scheduler.json"
    target.write_text('{"old": 1}')
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_files.atomic_path(target) as tmp:
            tmp.write_text('{"new": ')
            raise RuntimeError("disk on fire")
    assert json.loads(target.read_text()) == {"old": 1}
    assert leftovers(tmp_path) == []


def test_replacing_a_file_never_shows_a_partial_one(tmp_path, monkeypatch):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old")
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append(Path(dst).read_bytes())  # what a reader sees just before the rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    atomic_files.atomic_write_bytes(target, b"new contents")
    assert seen == [b"old"]
    assert target.read_bytes() == b"new contents"


def test_rename_fsyncs_both_directories(tmp_path, fsyncs):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    atomic_files.atomic_rename(tmp_path / "a" / "f", tmp_path / "b" / "f")
    synced = {p for p, is_dir, _ in fsyncs if is_dir}
    assert synced == {tmp_path / "a", tmp_path / "b"}


def test_safetensors_and_json_writers_are_atomic(tmp_path, fsyncs):
    atomic_save({"w": torch.arange(4.0)}, tmp_path / "rank00000.safetensors")
    check_committed(fsyncs, tmp_path / "rank00000.safetensors")
    write_meta(tmp_path, "adam", [{"lr": 0.1, "params": [0]}], {"w": {"group": 0, "step": 1}}, None)
    check_committed(fsyncs, tmp_path / "optimizer.json")
    assert read_meta(tmp_path)["param_groups"] == [{"lr": 0.1}]
    assert leftovers(tmp_path) == []


def test_streamed_files_commit_every_shard_and_the_index(tmp_path, fsyncs):
    tensors = {f"t{i}": torch.full((256,), float(i)) for i in range(3)}
    plan = [(k, t.numel() * t.element_size()) for k, t in tensors.items()]
    out = StreamedFiles(tmp_path / "model", "model", plan, max_bytes=1024, write=True)
    for k, t in tensors.items():
        out.add(k, t)
    out.finish()
    names = sorted(p.name for p in (tmp_path / "model").iterdir())
    assert names == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    for name in names:
        check_committed(fsyncs, tmp_path / "model" / name)
    with TensorReader(tmp_path / "model", "model") as reader:
        assert all(torch.equal(reader.get(k), t) for k, t in tensors.items())
    assert leftovers(tmp_path) == []


def test_a_directory_the_filesystem_cannot_fsync_is_no_error(tmp_path, monkeypatch):
    def refuse(code: int):
        def fsync(fd: int) -> None:
            raise OSError(code, os.strerror(code))

        return fsync

    monkeypatch.setattr(os, "fsync", refuse(errno.EINVAL))  # as some FUSE mounts answer
    atomic_files.fsync_directory(tmp_path)
    monkeypatch.setattr(os, "fsync", refuse(errno.EIO))
    with pytest.raises(OSError, match=os.strerror(errno.EIO)):
        atomic_files.fsync_directory(tmp_path)
