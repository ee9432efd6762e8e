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


@pytest.mark.timeout(200)
@pytest.mark.parametrize("plugin", ["zero2", "gemini"])
def test_cli_offload_auto(tmp_path, plugin):
    """--offload auto on CPU ranks with a simulated device of 1 GB: everything fits, so
    after the warm-up step every chunk (and at stage 3 every parameter shard) is back."""
    words = ["--offload", "auto", "--device-budget-gb", "1", "--plugin", plugin, "--steps", "4"]
    words += ["--batch-size", "4", "--seq-len", "32", "--eval-every", "4", "--eval-batches", "1"]
    out = subprocess.run(
        [*CLI, *words, "--out", str(tmp_path), "--name", "auto", "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"plugin {plugin} (offload auto)" in out.stdout
    (line,) = [x for x in out.stdout.splitlines() if "offloaded / rank" in x]
    n = re.search(r"auto placement: (\d+) of (\d+) chunks back on the device", line)
    assert n and n[1] == n[2], line
    assert ("parameter shard" in line) == (plugin == "gemini"), line
    assert "host:" not in line, line  # nothing left on the host, its staging freed too
