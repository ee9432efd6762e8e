"""The structured forms `--data` takes besides text files: JSON Lines (one record a line,
its text under --text-field) and a Hugging Face `datasets` folder (what
Dataset.save_to_disk or DatasetDict.save_to_disk wrote; its "train" split, or its only
one). Each gives the records' texts joined by a newline, as UTF-8 bytes."""

from __future__ import annotations

import json
from pathlib import Path

#: files save_to_disk writes at the top of the folder (a Dataset's, a DatasetDict's)
DATASET_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def is_dataset_dir(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in DATASET_MARKERS)


def _field(record: object, field: str, where: str) -> str:
    if not isinstance(record, dict):
        raise ValueError(f"--data {where}: a record is {type(record).__name__}, not an object")
    if field not in record:
        keys = ", ".join(map(str, list(record)[:8]))
        raise ValueError(
            f"--data {where}: no {field!r} in the record (its keys: {keys}); pass --text-field NAME"
        )
    value = record[field]
    if not isinstance(value, str):
        raise ValueError(f"--data {where}: {field!r} is {type(value).__name__}, not text")
    return value


def jsonl_text(path: Path, field: str, first_only: bool = False) -> bytes:
    """The texts of a .jsonl file; first_only: check the first record alone (no reading)."""
    texts = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"--data {path}:{n}: not JSON ({e.msg})") from None
            texts.append(_field(record, field, f"{path}:{n}"))
            if first_only:
                break
    if not texts:
        raise ValueError(f"--data {path}: no records")
    return "\n".join(texts).encode("utf-8")


def _open_dataset(path: Path):  # -> datasets.Dataset
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"--data {path} is a Hugging Face datasets folder; reading it needs datasets: "
            "pip install datasets"
        ) from None
    found = datasets.load_from_disk(str(path))
    if isinstance(found, datasets.DatasetDict):
        if "train" in found:
            return found["train"]
        if len(found) != 1:
            raise ValueError(
                f"--data {path}: splits {', '.join(found)} and none named train; pass the "
                "folder of one split"
            )
        return next(iter(found.values()))
    return found


def dataset_text(path: Path, field: str, first_only: bool = False) -> bytes:
    """The texts of a datasets folder; first_only: check the column and one row alone."""
    ds = _open_dataset(path)
    if field not in ds.column_names:
        raise ValueError(
            f"--data {path}: no column {field!r} (its columns: {', '.join(ds.column_names)}); "
            "pass --text-field NAME"
        )
    rows = ds.select(range(min(1, len(ds)))) if first_only else ds
    texts = [t for t in rows[field] if isinstance(t, str)]
    if not texts:
        raise ValueError(f"--data {path}: no text in column {field!r}")
    return "\n".join(texts).encode("utf-8")
