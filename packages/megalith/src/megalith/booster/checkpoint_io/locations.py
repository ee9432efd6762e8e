"""Where a checkpoint's files are: ColossalAI's file-name prefix on save, and on load the
directory of standard names (model.safetensors[.index.json], optimizer.json, ...) that the
readers take, made for whatever path the user passes.

ColossalAI's `prefix` names files, not tensors: save_model(..., shard=True, prefix="p")
writes model.p-00001-of-00002.safetensors and model.p.safetensors.index.json. A load
takes a directory (its one model index, or its one safetensors file), an index file,
or a single file, whatever the prefix, as ColossalAI's loads do; when the names are not
the standard ones the readers get a temporary directory of links to the real files.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from megalith_core.atomic_files import atomic_rename, atomic_write_json
from megalith_core.safetensors_files import read_index_file, shard_path

from .safetensors_join import OPTIMIZER_META, read_metadata

PICKLED = (".bin", ".pt", ".pth", ".pkl")


def prefixed(name: str, prefix: str | None) -> str:
    """model.safetensors -> model.<prefix>.safetensors, model-00001-of-00002.safetensors
    -> model.<prefix>-00001-of-00002.safetensors (ColossalAI's rule: after the stem)."""
    if not prefix:
        return name
    stem = re.match(r"[A-Za-z_]+", name)
    end = stem.end() if stem else 0
    return f"{name[:end]}.{prefix}{name[end:]}"


def publish(staging: Path, target: Path, prefix: str | None) -> None:
    """Moves every file of staging into target under its prefixed name: the tensors first,
    then the index files (their weight maps renamed too), then optimizer.json, the
    marker of a finished save. The writer's call."""
    target.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in staging.iterdir() if p.is_file())
    indexes = [p for p in files if p.name.endswith(".index.json")]
    markers = [p for p in files if p.suffix == ".json" and p not in indexes]
    for p in files:
        if p not in indexes and p not in markers:
            atomic_rename(p, target / prefixed(p.name, prefix))
    for p in indexes:
        index = json.loads(p.read_text())
        index["weight_map"] = {k: prefixed(v, prefix) for k, v in index["weight_map"].items()}
        atomic_write_json(target / prefixed(p.name, prefix), index, indent=1)
    for p in markers:
        atomic_rename(p, target / prefixed(p.name, prefix))


def is_safetensors(path: Path) -> bool:
    """By content (megalith writes safetensors whatever the name: ColossalAI's tests save
    to model.bin): an 8-byte header length that fits the file, then a JSON object."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return head[8:9] == b"{" and 8 + n <= path.stat().st_size


def refuse_pickled(path: Path) -> None:
    if path.suffix in PICKLED and not is_safetensors(path):
        raise ValueError(
            f"{path}: a pickled checkpoint; megalith loads safetensors only (nothing "
            "unpickled): convert it once with safetensors.torch.save_file(torch.load(path), "
            "'model.safetensors'), or save it with save_pretrained(safe_serialization=True)"
        )


@contextlib.contextmanager
def _links(entries: dict[str, Path]) -> Iterator[Path]:
    view = Path(tempfile.mkdtemp(prefix=".megalith-view-"))
    try:
        for name, target in entries.items():
            (view / name).symlink_to(target.resolve())
        yield view
    finally:
        shutil.rmtree(view, ignore_errors=True)


def _model_files(path: Path) -> tuple[Path | None, Path | None]:
    """(index, single file) of a checkpoint path; one of them is None."""
    if path.is_file():
        if path.name.endswith(".index.json"):
            return path, None
        refuse_pickled(path)
        return None, path
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such checkpoint file or directory")
    indexes = [
        p
        for p in sorted(path.glob("*.index.json"))
        if ".safetensors." in p.name and not p.name.startswith("optimizer")
    ]
    if len(indexes) > 1:
        raise ValueError(
            f"{path} holds {len(indexes)} model index files ({[p.name for p in indexes]}): "
            "pass the path of the one to load"
        )
    if indexes:
        return indexes[0], None
    if (path / "model.safetensors").is_file():
        return None, path / "model.safetensors"
    singles = [
        p
        for p in sorted(path.glob("*.safetensors"))
        if not p.name.startswith(("optimizer", "buffers"))
    ]
    if len(singles) == 1:
        return None, singles[0]
    for p in sorted(path.iterdir()):
        refuse_pickled(p)
    raise FileNotFoundError(
        f"{path}: no model.safetensors.index.json and not exactly one .safetensors file "
        f"(found {[p.name for p in singles]}): not a model checkpoint"
    )


@contextlib.contextmanager
def model_view(checkpoint: str | Path) -> Iterator[Path]:
    """A directory with model.safetensors.index.json (and the files it names) or
    model.safetensors: the model files of checkpoint."""
    index, single = _model_files(Path(checkpoint))
    if index is not None:
        if index.name == "model.safetensors.index.json":
            yield index.parent
            return
        names = set(read_index_file(index).values())
        links = {n: shard_path(index.parent, n, index) for n in names}
        links["model.safetensors.index.json"] = index
        with _links(links) as view:
            yield view
        return
    if single is None:
        raise FileNotFoundError("no model checkpoint file was found to load")
    if single.name == "model.safetensors":
        yield single.parent
        return
    with _links({"model.safetensors": single}) as view:
        yield view


def _optimizer_prefix(directory: Path) -> str | None:
    """The prefix of the one optimizer.<prefix>.json in directory ("" for optimizer.json)."""
    if (directory / "optimizer.json").is_file():
        return ""
    metas = [p for p in directory.glob("optimizer.*.json") if not p.name.endswith(".index.json")]
    if len(metas) > 1:
        raise ValueError(
            f"{directory} holds {len(metas)} optimizer checkpoints "
            f"({[p.name for p in metas]}): pass the path of one's index file"
        )
    return metas[0].name[len("optimizer.") : -len(".json")] if metas else None


@contextlib.contextmanager
def optimizer_view(checkpoint: str | Path, prefix: str | None = None) -> Iterator[Path]:
    """A directory with optimizer.json and optimizer.safetensors[.index.json]: the
    optimizer files of checkpoint (a directory, an index file in one, or a single file);
    `prefix` picks optimizer.<prefix>.json in a directory holding several."""
    path = Path(checkpoint)
    if path.is_file() and not path.name.endswith(".index.json"):
        refuse_pickled(path)
        meta = read_metadata(path).get(OPTIMIZER_META)
        if meta is None:
            raise ValueError(
                f"{path}: not a megalith optimizer checkpoint (its metadata has no "
                f"{OPTIMIZER_META!r}); save the optimizer with megalith's save_optimizer"
            )
        view = Path(tempfile.mkdtemp(prefix=".megalith-view-"))
        try:
            (view / "optimizer.json").write_text(meta)
            (view / "optimizer.safetensors").symlink_to(path.resolve())
            yield view
        finally:
            shutil.rmtree(view, ignore_errors=True)
        return
    if path.is_file():  # optimizer[.<prefix>].safetensors.index.json
        directory = path.parent
        prefix = path.name[len("optimizer") : -len(".safetensors.index.json")].lstrip(".")
    else:
        directory = path
        if prefix and (path / prefixed("optimizer.json", prefix)).is_file():
            found: str | None = prefix
        else:
            found = _optimizer_prefix(path) if path.is_dir() else None
        if found is None:
            raise FileNotFoundError(
                f"{path}: no optimizer.json (not a megalith optimizer checkpoint, or an "
                "unfinished save)"
            )
        prefix = found
    if not prefix:
        yield directory
        return
    links = {"optimizer.json": directory / prefixed("optimizer.json", prefix)}
    for p in directory.glob(f"optimizer.{prefix}*.safetensors*"):
        if p.name.startswith((f"optimizer.{prefix}.", f"optimizer.{prefix}-")):
            links[p.name] = p  # the index names the files by their own names
            std = "optimizer" + p.name[len(f"optimizer.{prefix}") :]
            if std.startswith("optimizer."):  # the index, or a single file
                links[std] = p
    with _links(links) as view:
        yield view
