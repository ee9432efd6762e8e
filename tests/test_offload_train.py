"""`megalith train --offload nvme`: trains with optimizer states on NVMe, checkpoints,
and leaves no swap directory behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "megalith", "train"]


@pytest.mark.timeout(200)
def test_cli_offload_nvme(tmp_path):
    swap = tmp_path / "swap"
    words = ["--offload", "nvme", "--swap-dir", str(swap), "--steps", "4", "--batch-size", "4"]
    words += ["--seq-len", "32", "--eval-every", "4", "--save-every", "2", "--eval-batches", "1"]
    out = subprocess.run(
        [*CLI, *words, "--out", str(tmp_path), "--name", "off", "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "plugin zero2 (offload nvme)" in out.stdout
    assert (tmp_path / "off" / "checkpoints" / "step_000004").is_dir()
    assert swap.is_dir() and not list(swap.glob("megalith-swap-*")), list(swap.iterdir())
