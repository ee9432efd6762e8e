"""Run checkpoints: model, optimizer, scheduler and the trainer's own state, atomically.

A checkpoint is a directory runs/NAME/checkpoints/step_000123/ holding the
Booster's layout-free files plus trainer.json (step, data position, RNG states of
every rank, the run's arguments). It is written under a temporary name and
renamed after every rank has finished; every file in it, trainer.json last, goes
through megalith_core.atomic_files (fsync'ed, and its directory too), and so do
the rename and `latest`, a text file naming the newest complete one. A run killed
at any moment leaves either the previous checkpoint or the new one, never half of one.

With use_async (megalith train's default) save() returns once the state is copied to
host memory; rank 0's writer thread writes the files, then manifest.json (each file's
size and CRC-32, megalith_core.file_checks), trainer.json, the rename and `latest`, in
that order. The next save and the end of the run wait for it (wait_saves, on every
rank). A save that fails removes its .tmp_step_* directory and raises on every rank.

On --resume, find_intact() verifies the candidates newest first (the ranks share the
files) and skips a damaged one with a warning naming the file and what is wrong.
"""

from __future__ import annotations

import base64
import contextlib
import json
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import megalith_comm as comm
from megalith.booster.checkpoint_io import async_writes
from megalith.booster.checkpoint_io.base import agree
from megalith_core.atomic_files import atomic_rename, atomic_write_json, atomic_write_text
from megalith_core.file_checks import (
    DamagedCheckpointError,
    files_to_verify,
    verify_file,
    write_manifest,
)

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


#: background saves not yet renamed into place (a failed one's directory goes)
_unpublished: set[Path] = set()


def wait_saves() -> None:
    """Collective: every background save has finished; a failed one raises on every rank
    and its .tmp_step_* directory is removed (the writes after a failure are skipped)."""
    error = None
    try:
        async_writes.wait()
    except Exception as e:
        error = e
        for tmp in list(_unpublished):
            _discard(tmp)
    agree(error)


def save(
    booster: Any,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    root: Path,
    step: int,
    extra: dict[str, Any],
    use_async: bool = False,
    keep_last: int | None = None,
) -> Path:
    """Collective. Returns the checkpoint directory (complete once wait_saves returns).
    keep_last: once this one is complete, only the newest keep_last complete ones stay."""
    import torch.distributed as dist

    wait_saves()
    world = comm.get_world()
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if world.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    comm.barrier()
    try:
        booster.save_model(
            model, str(tmp / "model"), shard=True, size_per_shard=1024, use_async=use_async
        )
        booster.save_optimizer(
            optimizer, str(tmp / "optimizer"), shard=True, size_per_shard=1024, use_async=use_async
        )
        booster.save_lr_scheduler(scheduler, str(tmp / "scheduler.json"))
        rngs = [None] * world.world_size
        dist.all_gather_object(rngs, _rng_state())
    except BaseException:
        if use_async:  # writes already queued into tmp finish before it is removed
            with contextlib.suppress(Exception):  # the error being raised is the cause
                async_writes.wait()
        if world.rank == 0:
            _discard(tmp)
        raise
    meta = {"step": step, "rng": rngs, **extra}

    def finish() -> None:
        try:
            write_manifest(tmp)
            # Its directory's fsync also makes the names of model/ and optimizer/ durable.
            atomic_write_json(tmp / COMPLETE, meta, indent=1)
            if final.exists():
                shutil.rmtree(final)
            atomic_rename(tmp, final)
            atomic_write_text(root / "latest", final.name)
            _unpublished.discard(tmp)
            if keep_last is not None:
                prune(root, keep_last, final)
        except BaseException:
            _discard(tmp)
            raise

    if use_async:
        if world.rank == 0:
            _unpublished.add(tmp)
            async_writes.submit(finish)
        return final
    error = None
    if world.rank == 0:
        try:
            finish()
        except Exception as e:
            error = e
    agree(error)
    return final


def prune(root: Path, keep_last: int, newest: Path) -> list[Path]:
    """Removes complete checkpoints older than the newest keep_last (never `newest`, the
    one just published); returns what went."""
    done = sorted((p for p in root.glob("step_*") if (p / COMPLETE).exists()), reverse=True)
    gone = [p for p in done[max(1, keep_last) :] if p != newest]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def _discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    _unpublished.discard(tmp)


def find(path: Path) -> Path | None:
    """The newest complete checkpoint under a run directory, or the given checkpoint itself
    (not verified: find_intact verifies)."""
    found = candidates(path)
    return found[0] if found else None


def candidates(path: Path) -> list[Path]:
    """Complete checkpoints (trainer.json present), newest first: the given checkpoint
    itself, or under a run directory the one `latest` names, then every step_*."""
    if (path / COMPLETE).exists():
        return [path]
    root = path / "checkpoints" if (path / "checkpoints").exists() else path
    done = sorted((p for p in root.glob("step_*") if (p / COMPLETE).exists()), reverse=True)
    latest = root / "latest"
    if latest.is_file():
        named = root / latest.read_text().strip()
        if named in done:
            done.remove(named)
            done.insert(0, named)
    return done


def damage(ckpt: Path) -> DamagedCheckpointError | None:
    """Collective: what is wrong with a checkpoint (the first damaged file), or None; the
    ranks check a share of the files each and agree."""
    import torch.distributed as dist

    world = comm.get_world()
    problem: str | None = None
    try:
        files = files_to_verify(ckpt)
        for name, entry in files[world.rank :: world.world_size]:
            verify_file(ckpt, name, entry)
        json.loads((ckpt / COMPLETE).read_text())
    except DamagedCheckpointError as e:
        problem = json.dumps([str(e.path), e.reason])
    except (OSError, ValueError) as e:
        problem = json.dumps([str(ckpt / COMPLETE), f"unreadable ({e})"])
    found: list[Any] = [None] * world.world_size
    dist.all_gather_object(found, problem)
    first = next((json.loads(p) for p in found if p), None)
    return DamagedCheckpointError(first[0], first[1]) if first else None


def find_intact(path: Path) -> Path | None:
    """Collective: the newest checkpoint that verifies. A damaged one is skipped with a
    warning naming the file and the reason; one asked for by name is refused instead."""
    for ckpt in candidates(path):
        problem = damage(ckpt)
        if problem is None:
            return ckpt
        if ckpt == path:
            raise SystemExit(f"megalith train: --resume {path}: {problem}")
        if comm.get_world().rank == 0:
            warnings.warn(
                f"megalith train: skipping the damaged checkpoint {ckpt.name}: {problem.path}: "
                f"{problem.reason}; resuming from an earlier one",
                stacklevel=2,
            )
    return None


def load(booster: Any, model: Any, optimizer: Any, scheduler: Any, ckpt: Path) -> dict[str, Any]:
    meta = json.loads((ckpt / COMPLETE).read_text())
    wait_saves()
    booster.load_model(model, str(ckpt / "model"))
    booster.load_optimizer(optimizer, str(ckpt / "optimizer"))
    booster.load_lr_scheduler(scheduler, str(ckpt / "scheduler.json"))
    rank = comm.get_world().rank
    rngs = meta["rng"]
    if rank < len(rngs):
        _set_rng_state(rngs[rank])
    return meta
