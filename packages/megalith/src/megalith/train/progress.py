"""Rank 0's progress bar and the run's metrics file (JSON lines)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from megalith_core.atomic_files import atomic_write_text


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Progress:
    """A one-line bar redrawn in place on a terminal; a plain line every `every` steps otherwise."""

    def __init__(self, total: int, start: int, out: TextIO = sys.stdout, every: int = 25):
        self.total, self.step, self.out, self.every = total, start, out, every
        self.tty = out.isatty()
        self.t0 = time.perf_counter()

    def update(self, step: int, fields: dict[str, str]) -> None:
        self.step = step
        width = 24
        done = int(width * step / max(self.total, 1))
        bar = "#" * done + "-" * (width - done)
        text = f"[{bar}] {step}/{self.total} " + " ".join(f"{k} {v}" for k, v in fields.items())
        if self.tty:
            self.out.write("\r" + text[:200].ljust(120))
            self.out.flush()
        elif step % self.every == 0 or step == self.total:
            self.out.write(text + "\n")
            self.out.flush()

    def close(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


class Metrics:
    """Appends one JSON object per line; survives a resume (it appends)."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled
        self.rows: list[dict[str, Any]] = []
        if enabled and path.exists():
            self.rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def write(self, row: dict[str, Any], resume_from: int | None = None) -> None:
        if not self.enabled:
            return
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def truncate_after(self, step: int) -> None:
        """On resume: drop rows of steps after the checkpoint (they will be run again)."""
        if not self.enabled:
            return
        self.rows = [r for r in self.rows if r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.rows))
