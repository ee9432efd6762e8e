"""`megalith train --offload nvme`: trains with optimizer states on NVMe (clipping, so
the update waits for step()), checkpoints, and leaves no swap directory behind; and
`--offload cpu --max-norm 0`, where host chunks are updated during backward; and
`--offload nvme --nvme-masters`, with the fp32 masters in the swap files too."""

from __future__ import annotations

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
    if tier == "nvme-masters":  # the fp32 masters in the swap files too
        tier, where = "nvme", [*where, "--nvme-masters"]
    words = ["--offload", tier, *where, "--steps", "4", "--batch-size", "4"]
    words += ["--seq-len", "32", "--eval-every", "4", "--save-every", "2", "--eval-batches", "1"]
    out = subprocess.run(
        [*CLI, *words, "--out", str(tmp_path), "--name", "off", "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"plugin zero2 (offload {tier})" in out.stdout
    assert (tmp_path / "off" / "checkpoints" / "step_000004").is_dir()
    assert swap.is_dir() and not list(swap.glob("megalith-swap-*")), list(swap.iterdir())
