"""`megalith train --tensorboard`: the metrics rows as TensorBoard scalars under
runs/NAME/tensorboard/ (rank 0), through torch.utils.tensorboard, which needs the
tensorboard package; without it the option is refused before any rank starts."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

#: metrics.jsonl key -> (TensorBoard tag, scale)
TAGS = {
    "loss": ("loss/train", 1.0),
    "val_loss": ("loss/val", 1.0),
    "lr": ("optim/lr", 1.0),
    "grad_norm": ("optim/grad_norm", 1.0),
    "tokens_per_s": ("perf/tokens_per_s", 1.0),
    "mfu": ("perf/mfu", 1.0),
    "step_s": ("perf/step_s", 1.0),
    "peak_bytes": ("memory/peak_gib", 1.0 / 2**30),
}


def available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def check(args: argparse.Namespace) -> None:
    """ValueError when --tensorboard cannot write (the package is missing)."""
    if getattr(args, "tensorboard", False) and not available():
        raise ValueError(
            "--tensorboard needs the tensorboard package (torch.utils.tensorboard writes "
            "through it): pip install tensorboard"
        )


class TensorBoardLog:
    """Writes each metrics row's numbers as scalars at its step; a resumed run drops the
    events after its checkpoint's step (they are trained again)."""

    def __init__(self, run_dir: Path, resumed_at: int = 0):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = run_dir / "tensorboard"
        self.writer = SummaryWriter(
            str(self.dir), purge_step=resumed_at + 1 if resumed_at else None, flush_secs=10
        )

    def write(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        for key, (tag, scale) in TAGS.items():
            value = row.get(key)
            if isinstance(value, (int, float)):
                self.writer.add_scalar(tag, float(value) * scale, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
