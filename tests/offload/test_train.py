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
#: a short run: 4 steps of 4 sequences of 32 bytes on 2 CPU ranks, one eval batch
SHORT = ["--steps", "4", "--batch-size", "4", "--seq-len", "32", "--eval-every", "4"]
SHORT += ["--eval-batches", "1", "--nproc", "2"]


def train(tmp_path, name: str, words: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    """The finished process of a short `megalith train` run that must succeed, and the
    summary's "offloaded / rank" line."""
    out = subprocess.run(
        [*CLI, *words, *SHORT, "--out", str(tmp_path), "--name", name],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (line,) = [x for x in out.stdout.splitlines() if "offloaded / rank" in x]
    return out, line


@pytest.mark.timeout(200)
@pytest.mark.parametrize("tier", ["nvme", "cpu", "nvme-masters"])
def test_cli_offload(tmp_path, tier):
    swap = tmp_path / "swap"
    swap.mkdir()
    where = ["--swap-dir", str(swap)] if tier != "cpu" else ["--max-norm", "0"]
    said, placed = f"(offload {'host' if tier == 'cpu' else tier})", r"host: master"
    if tier == "nvme":
        placed = r"host: master .*; nvme: optim_states"
    if tier == "nvme-masters":  # the fp32 masters in the swap files too
        tier, where = "nvme", [*where, "--nvme-masters"]
        said, placed = "(offload nvme, masters on nvme)", r"host: staging [^;]*; nvme: .*master"
    out, line = train(tmp_path, "off", ["--offload", tier, *where, "--save-every", "2"])
    assert f"plugin zero2 {said}" in out.stdout
    assert re.search(placed, line), line  # the summary says where the state went
    # ZeRO steps for the wrapped optimizer: the LR scheduler built on it must not warn
    assert "lr_scheduler.step()` before `optimizer.step()" not in out.stderr, out.stderr[-2000:]
    assert (tmp_path / "off" / "checkpoints" / "step_000004").is_dir()
    assert swap.is_dir() and not list(swap.glob("megalith-swap-*")), list(swap.iterdir())


@pytest.mark.timeout(200)
@pytest.mark.parametrize("plugin", ["zero2", "gemini"])
def test_cli_offload_auto(tmp_path, plugin):
    """--offload auto on CPU ranks with a simulated device of 1 GB: everything fits, so
    after the warm-up step every chunk (and at stage 3 every parameter shard) is back."""
    words = ["--offload", "auto", "--device-budget-gb", "1", "--plugin", plugin]
    out, line = train(tmp_path, "auto", words)
    assert f"plugin {plugin} (offload auto)" in out.stdout
    n = re.search(r"auto placement: (\d+) of (\d+) chunks back on the device", line)
    assert n and n[1] == n[2], line
    assert ("parameter shard" in line) == (plugin == "gemini"), line
    assert "host:" not in line, line  # nothing left on the host, its staging freed too
