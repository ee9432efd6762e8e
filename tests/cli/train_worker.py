"""Ranks of the train tests: run the `megalith train` loop in-process."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from megalith.train.loop import train
from megalith.train.options import add_options

SMALL = [
    "--model",
    "gpt-tiny",
    "--batch-size",
    "4",
    "--seq-len",
    "32",
    "--eval-every",
    "6",
    "--eval-batches",
    "1",
    "--warmup",
    "2",
    "--lr",
    "3e-3",
]


def args(*words: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_options(p)
    return p.parse_args([*SMALL, *words])


def losses(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows]


def resume_run(rank: int, setting: tuple[str, str]):
    """Uninterrupted 12 steps vs 6 steps, stop, resume to 12: per-step losses."""
    plugin, root = setting
    a = Path(root) / plugin / "a"
    b = Path(root) / plugin / "b"
    common = ["--plugin", plugin, "--steps", "12", "--save-every", "3"]
    train(args(*common, "--out", str(a.parent), "--name", "a"))
    train(args(*common, "--out", str(b.parent), "--name", "b", "--stop-after", "7"))
    train(args(*common, "--out", str(b.parent), "--name", "b", "--resume"))
    return (losses(a), losses(b)) if rank == 0 else None
