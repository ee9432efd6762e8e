"""Ranks of tests/cli/test_train_options.py: the `megalith train` loop in-process."""

from __future__ import annotations

import json
from pathlib import Path

from megalith.train import choices
from megalith.train.loop import train
from tests.cli.train_worker import args, losses


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def accum_run(rank: int, setting: tuple[str, str]):
    """--batch-size 2 --grad-accum 3 against --batch-size 6: per-step losses."""
    plugin, root = setting
    out = str(Path(root) / plugin)
    common = ["--plugin", plugin, "--steps", "3", "--save-every", "100", "--out", out]
    train(args(*common, "--name", "accum", "--batch-size", "2", "--grad-accum", "3"))
    train(args(*common, "--name", "big", "--batch-size", "6"))
    return (losses(Path(out) / "accum"), losses(Path(out) / "big")) if rank == 0 else None


def schedule_run(rank: int, setting: tuple[list[str], str]):
    """A few steps under an optimizer and schedule: the lr of metrics.jsonl at each step
    and the lr the schedule gives, and the losses."""
    words, root = setting
    name = "-".join(w.strip("-") for w in words)
    a = args(*words, "--steps", "5", "--save-every", "100", "--out", root, "--name", name)
    train(a)
    if rank != 0:
        return None
    rows = _rows(Path(root) / name)
    factor = choices.lr_factor(a)
    return [(r["lr"], a.lr * factor(r["step"]), r["loss"]) for r in rows]


def time_run(rank: int, root: str):
    """--max-time with a save every step and --keep-last 2: the steps trained and the
    checkpoints left."""
    words = ["--steps", "500", "--save-every", "1", "--keep-last", "2", "--max-time", "1.5"]
    train(args(*words, "--out", root, "--name", "t"))
    ckpts = Path(root) / "t" / "checkpoints"
    left = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step_"))
    first = [r["step"] for r in _rows(Path(root) / "t")], left, (ckpts / "latest").read_text()
    # --overwrite: the same name again, from nothing
    train(args("--steps", "1", "--overwrite", "--out", root, "--name", "t"))
    again = [r["step"] for r in _rows(Path(root) / "t")], sorted(p.name for p in ckpts.iterdir())
    return (first, again) if rank == 0 else None
