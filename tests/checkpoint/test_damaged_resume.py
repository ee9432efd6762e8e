"""A damaged newest checkpoint does not block a resume (issue 21 item 5): truncated, with
a wrong checksum, or with a file missing, it is skipped with a warning naming the file
and the reason and the previous one is taken; a full disk during a save leaves the
previous checkpoint loadable, removes the partial one and names the file."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

import megalith_comm as comm
from megalith.booster.checkpoint_io import GeneralCheckpointIO
from megalith.testing import DistributedTestError, run_distributed
from megalith.train import state
from megalith.train.loop import train
from megalith_core.file_checks import DamagedCheckpointError
from tests.cli.train_worker import args, losses

KINDS = ("truncated", "checksum", "missing")


def _damage(ckpt: Path, kind: str) -> Path:
    """Damages one file of ckpt; returns it."""
    if kind == "truncated":
        f = ckpt / "model" / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-100])
    elif kind == "checksum":  # same size, one byte flipped in the data
        f = ckpt / "optimizer" / "optimizer.safetensors"
        data = bytearray(f.read_bytes())
        data[-7] ^= 0x5A
        f.write_bytes(bytes(data))
    else:
        f = ckpt / "scheduler.json"
        f.unlink()
    return f


def resume_past_damage(rank: int, root: str) -> dict:
    base = Path(root)
    common = ["--plugin", "ddp", "--steps", "6", "--save-every", "3"]
    train(args(*common, "--out", root, "--name", "a"))
    out = {"a": losses(base / "a")}
    for kind in KINDS:
        if rank == 0:
            shutil.copytree(base / "a", base / kind)
            out[f"{kind} file"] = str(_damage(base / kind / "checkpoints" / "step_000006", kind))
        comm.barrier()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            found = state.find_intact(base / kind)
        out[kind] = (found.name if found else None, [str(w.message) for w in seen])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(args(*common, "--out", root, "--name", "truncated", "--resume"))
    out["resumed"] = losses(base / "truncated")
    return out


@pytest.mark.timeout(90)
def test_resume_skips_a_damaged_checkpoint_and_warns(tmp_path):
    per_rank = run_distributed(resume_past_damage, 2, str(tmp_path), timeout=80)
    zero = per_rank[0]
    for rank, out in enumerate(per_rank):
        for kind in KINDS:
            found, seen = out[kind]
            assert found == "step_000003", f"rank {rank} {kind}: took {found}"
            if rank == 0:  # rank 0 says it, once
                assert len(seen) == 1, f"{kind}: {seen}"
                assert "step_000006" in seen[0] and zero[f"{kind} file"] in seen[0], seen
    reasons = {k: per_rank[0][k][1][0] for k in KINDS}
    assert "truncated" in reasons["truncated"], reasons
    assert "checksum" in reasons["checksum"], reasons
    assert "missing" in reasons["missing"], reasons
    # steps 4..6 run again from step 3's state: the losses of the uninterrupted run
    assert zero["resumed"] == zero["a"], (zero["resumed"], zero["a"])


def test_a_truncated_file_names_itself_on_load(tmp_path):
    model = torch.nn.Linear(40, 30)
    io = GeneralCheckpointIO()
    io.save_model(model, str(tmp_path / "m"), shard=True)
    f = tmp_path / "m" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-64])
    with pytest.raises(DamagedCheckpointError) as e:
        io.load_model(torch.nn.Linear(40, 30), str(tmp_path / "m"))
    assert str(f) in str(e.value) and "bytes" in str(e.value), str(e.value)


def full_disk(rank: int, setting: tuple[str, bool]) -> None:
    root, sync = setting
    common = ["--plugin", "ddp", "--steps", "6", "--save-every", "3", "--out", root]
    train(args(*common, "--name", "f", *(["--sync-save"] if sync else [])))


def _checkpoint_bytes(tmp_path: Path) -> int:
    run_distributed(full_disk, 2, (str(tmp_path / "probe"), True), timeout=60)
    ckpt = tmp_path / "probe" / "f" / "checkpoints" / "step_000003"
    return sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, sync):
    size = _checkpoint_bytes(tmp_path)
    disk = tmp_path / "disk"
    disk.mkdir()
    # room for one checkpoint and a half: the second save runs out of space
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(size * 1.5) + 200_000}", "tmpfs", str(disk)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        with pytest.raises(DistributedTestError) as e:
            run_distributed(full_disk, 2, (str(disk), sync), timeout=60)
        text = str(e.value)
        assert "No space left" in text and "is full" in text, text
        assert str(disk / "f" / "checkpoints") in text, text  # the file it was writing
        ckpts = disk / "f" / "checkpoints"
        assert not list(ckpts.glob(".tmp_step_*")), list(ckpts.iterdir())
        assert state.find(disk / "f") == ckpts / "step_000003"
        assert not list(ckpts.glob("step_000006"))
        # and it loads: verified and read back into a fresh run
        shutil.copytree(disk / "f", tmp_path / "copy")
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    run_distributed(resume_copy, 2, str(tmp_path), timeout=60)


def resume_copy(rank: int, root: str) -> None:
    found = state.find_intact(Path(root) / "copy")
    assert found is not None and found.name == "step_000003", found
    common = ["--plugin", "ddp", "--steps", "4", "--save-every", "3", "--out", root]
    train(args(*common, "--name", "copy", "--resume"))
