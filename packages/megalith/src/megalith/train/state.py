"""Run checkpoints: model, optimizer, scheduler and the trainer's own state, atomically.

A checkpoint is a directory runs/NAME/checkpoints/step_000123/ holding the
Booster's layout-free files plus trainer.json (step, data position, RNG states of
every rank, the run's arguments). It is written under a temporary name and
renamed after every rank has finished; every file in it, trainer.json last, goes
through megalith_core.atomic_files (fsync'ed, and its directory too), and so do
the rename and `latest`, a text file naming the newest complete one. A run killed
at any moment leaves either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import base64
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

import megalith_comm as comm
from megalith_core.atomic_files import atomic_rename, atomic_write_json, atomic_write_text

COMPLETE = "trainer.json"


def _rng_state() -> dict[str, Any]:
    return {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "numpy": [s.tolist() if isinstance(s, np.ndarray) else s for s in np.random.get_state()],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(
        torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8)
    )
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def save(
    booster: Any,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    root: Path,
    step: int,
    extra: dict[str, Any],
) -> Path:
    """Collective. Returns the checkpoint directory."""
    world = comm.get_world()
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if world.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    comm.barrier()
    booster.save_model(model, str(tmp / "model"), shard=True, size_per_shard=1024)
    booster.save_optimizer(optimizer, str(tmp / "optimizer"), shard=True, size_per_shard=1024)
    booster.save_lr_scheduler(scheduler, str(tmp / "scheduler.json"))
    rngs = [None] * world.world_size
    import torch.distributed as dist

    dist.all_gather_object(rngs, _rng_state())
    if world.rank == 0:
        # Its directory's fsync also makes the names of model/ and optimizer/ durable.
        atomic_write_json(tmp / COMPLETE, {"step": step, "rng": rngs, **extra}, indent=1)
        if final.exists():
            shutil.rmtree(final)
        atomic_rename(tmp, final)
        atomic_write_text(root / "latest", final.name)
    comm.barrier()
    return final


def find(path: Path) -> Path | None:
    """The newest complete checkpoint under a run directory, or the given checkpoint itself."""
    if (path / COMPLETE).exists():
        return path
    root = path / "checkpoints" if (path / "checkpoints").exists() else path
    latest = root / "latest"
    if latest.exists() and (root / latest.read_text().strip() / COMPLETE).exists():
        return root / latest.read_text().strip()
    done = sorted(p for p in root.glob("step_*") if (p / COMPLETE).exists())
    return done[-1] if done else None


def load(booster: Any, model: Any, optimizer: Any, scheduler: Any, ckpt: Path) -> dict[str, Any]:
    meta = json.loads((ckpt / COMPLETE).read_text())
    booster.load_model(model, str(ckpt / "model"))
    booster.load_optimizer(optimizer, str(ckpt / "optimizer"))
    booster.load_lr_scheduler(scheduler, str(ckpt / "scheduler.json"))
    rank = comm.get_world().rank
    rngs = meta["rng"]
    if rank < len(rngs):
        _set_rng_state(rngs[rank])
    return meta
