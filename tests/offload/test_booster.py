"""The Booster's offload switches (LowLevelZeroPlugin(cpu_offload=True), GeminiPlugin(
offload_optim_frac=...), NVMe states through set_offload) train exactly as without, and
a checkpoint taken with states on NVMe (or parameter shards in host memory) resumes to
the same losses."""

from __future__ import annotations

from pathlib import Path

from megalith.testing import run_grid
from tests.offload.booster_worker import Run, train


def test_plugins_offload_and_checkpoint_through_nvme(tmp_path):
    swap, ckpt, ckpt_p = str(tmp_path / "swap"), str(tmp_path / "ckpt"), str(tmp_path / "ckpt_p")
    runs = [
        Run("zero2"),
        Run("zero2", cpu_offload=True),
        Run("gemini"),
        Run("gemini", frac=0.5),
        Run("zero2", nvme=swap, save_at=4, save_dir=ckpt),
        Run("zero2", nvme=swap, save_at=4, resume=ckpt),
        Run("gemini", frac=1.0, param_frac=0.5, save_at=4, save_dir=ckpt_p),
        Run("gemini", frac=1.0, param_frac=0.5, save_at=4, resume=ckpt_p),
        Run("zero2", cpu_offload=True, overlap_gather=True),
    ]
    (
        (z2, _),
        (z2_cpu, cpu_tiers),
        (g, _),
        (g_half, half_tiers),
        (z2_nvme, nvme_tiers),
        (resumed, _),
        (g_params, _),
        (g_params_resumed, _),
        (z2_overlapped, _),
    ) = [r[0] for r in run_grid(train, runs, 2, timeout=240)]
    assert z2_cpu == z2 and set(cpu_tiers) == {"host"}
    assert g_half == g and set(half_tiers) == {"host", "device"}
    assert z2_nvme == z2 and set(nvme_tiers) == {"nvme"}
    assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(resumed, z2[4:])), (resumed, z2[4:])
    assert len(resumed) == len(z2) - 4
    assert g_params == g  # half the parameter shards in host memory: the same numbers
    assert z2_overlapped == z2  # updated during backward, gathered during forward
    assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(g_params_resumed, g[4:]))
    assert not list(Path(swap).glob("megalith-swap-*"))
