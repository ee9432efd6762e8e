"""Asynchronous checkpoints (issue 21 item 11), megalith train's default: under TorchDDP,
LowLevelZero 2 and Gemini they write the same files as a synchronous save and resume to
the same losses; the step goes on while the files are written; and a SIGKILL during the
background write resumes from the previous complete checkpoint."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import warnings
from pathlib import Path

import pytest
from safetensors.torch import load_file

from megalith.booster.checkpoint_io import async_writes
from megalith.testing import DistributedTestError, run_distributed, run_grid
from megalith.train import state
from megalith.train.loop import train
from tests.cli.train_worker import args, losses

PLUGINS = ["ddp", "zero2", "gemini"]


def sync_vs_async(rank: int, setting: tuple[str, str]) -> dict | None:
    plugin, root = setting
    out = Path(root) / plugin
    common = ["--plugin", plugin, "--steps", "8", "--save-every", "3", "--out", str(out)]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train(args(*common, "--name", "sync", "--sync-save"))
        train(args(*common, "--name", "async", "--stop-after", "7"))
        train(args(*common, "--name", "async", "--resume"))
    fell_back = [str(w.message) for w in seen if "writes synchronously" in str(w.message)]
    if rank != 0:
        return None
    files = {}
    for name in ("sync", "async"):
        ckpt = out / name / "checkpoints" / "step_000006"
        files[name] = {
            **load_file(str(ckpt / "model" / "model.safetensors")),
            **load_file(str(ckpt / "optimizer" / "optimizer.safetensors")),
        }
    same = files["sync"].keys() == files["async"].keys() and all(
        files["sync"][k].equal(files["async"][k]) for k in files["sync"]
    )
    return {
        "sync": losses(out / "sync"),
        "async": losses(out / "async"),
        "same files": same,
        "fell back": fell_back,
        "manifest": (out / "async" / "checkpoints" / "step_000006" / "manifest.json").is_file(),
    }


@pytest.mark.timeout(120)
def test_async_saves_equal_sync_saves_and_resume(tmp_path):
    results = run_grid(sync_vs_async, [(p, str(tmp_path)) for p in PLUGINS], 2, timeout=110)
    for plugin, per_rank in zip(PLUGINS, results):
        out = per_rank[0]
        assert [s for s, _ in out["async"]] == list(range(1, 9)), plugin
        assert out["async"] == out["sync"], f"{plugin}: {out['async']} != {out['sync']}"
        assert out["same files"], f"{plugin}: step 6's files differ between sync and async"
        assert out["fell back"] == [], f"{plugin}: {out['fell back']}"
        assert out["manifest"], plugin


def killed_in_background_write(rank: int, root: str) -> None:
    """Rank 0's writer stalls in the step-4 save (after the tensor files, before the
    manifest), the steps go on, and then the process dies by SIGKILL."""
    real = state.write_manifest

    def stall(tmp: Path):
        if tmp.name != ".tmp_step_000004":
            return real(tmp)
        saved_at = time.monotonic()
        rows = Path(root) / "k" / "metrics.jsonl"
        while time.monotonic() - saved_at < 20:
            steps = [json.loads(x)["step"] for x in rows.read_text().splitlines()]
            if max(steps) >= 5:  # the step after the save ran while this write was pending
                (Path(root) / "step 5 ran during the write").touch()
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)

    if rank == 0:
        state.write_manifest = stall
    common = ["--plugin", "zero2", "--steps", "8", "--save-every", "2", "--out", root]
    train(args(*common, "--name", "k"))


def resume_after_kill(rank: int, root: str) -> str:
    found = state.find_intact(Path(root) / "k")
    common = ["--plugin", "zero2", "--steps", "8", "--save-every", "2", "--out", root]
    train(args(*common, "--name", "k", "--resume"))
    return found.name


@pytest.mark.timeout(90)
def test_sigkill_during_a_background_write_resumes_from_the_previous(tmp_path):
    with pytest.raises(DistributedTestError, match="rank 0 exited with code -9"):
        run_distributed(killed_in_background_write, 2, str(tmp_path), timeout=40)
    ckpts = tmp_path / "k" / "checkpoints"
    assert (tmp_path / "step 5 ran during the write").exists()
    assert (ckpts / ".tmp_step_000004").is_dir()  # the write that was killed
    assert (ckpts / "latest").read_text() == "step_000002"
    assert state.find(tmp_path / "k") == ckpts / "step_000002"
    taken = run_distributed(resume_after_kill, 2, str(tmp_path), timeout=40)
    rows = losses(tmp_path / "k")
    assert [s for s, _ in rows] == list(range(1, 9)), rows
    assert taken == ["step_000002"] * 2
    assert not list(ckpts.glob(".tmp_step_*")), "the next save of step 4 replaced it"


def test_the_writer_runs_beside_the_caller():
    """submit returns at once; synchronize (CheckpointIO's) waits for the write."""
    gate = threading.Event()
    done = []
    async_writes.submit(lambda: (gate.wait(5), done.append(1)))
    assert async_writes.pending() == 1 and not done
    gate.set()
    async_writes.wait()
    assert done == [1] and async_writes.pending() == 0
