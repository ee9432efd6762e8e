"""`megalith train --offload nvme`: trains with optimizer states on NVMe (clipping, so
the update waits for step()), checkpoints, and leaves no swap directory behind; and
`--offload cpu --max-norm 0`, where host chunks are updated during backward; and
`--offload nvme --nvme-masters`, with the fp32 masters in the swap files too."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "megalith", "train"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("tier", ["nvme", "cpu", "nvme-masters"])
def test_cli_offload(tmp_path, tier):
    swap = tmp_path / "swap"
    swap.mkdir()
    where = ["--swap-dir", str(swap)] if tier != "cpu" else ["--max-norm", "0"]
    said, placed = f"(offload {tier})", r"host: master"
    if tier == "nvme":
        placed = r"host: master .*; nvme: optim_states"
    if tier == "nvme-masters":  # the fp32 masters in the swap files too
        tier, where = "nvme", [*where, "--nvme-masters"]
        said, placed = "(offload nvme, masters on nvme)", r"host: staging [^;]*; nvme: .*master"
    words = ["--offload", tier, *where, "--steps", "4", "--batch-size", "4"]
    words += ["--seq-len", "32", "--eval-every", "4", "--save-every", "2", "--eval-batches", "1"]
    out = subprocess.run(
        [*CLI, *words, "--out", str(tmp_path), "--name", "off", "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"plugin zero2 {said}" in out.stdout
    # the summary says where this rank's training state went
    (line,) = [x for x in out.stdout.splitlines() if "offloaded / rank" in x]
    assert re.search(placed, line), line
    # ZeRO steps for the wrapped optimizer: the LR scheduler built on it must not warn
    assert "lr_scheduler.step()` before `optimizer.step()" not in out.stderr, out.stderr[-2000:]
    assert (tmp_path / "off" / "checkpoints" / "step_000004").is_dir()
    assert swap.is_dir() and not list(swap.glob("megalith-swap-*")), list(swap.iterdir())
