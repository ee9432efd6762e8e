"""Booster plugins with offloading, on the toy model (what each rank runs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from megalith.booster import Booster, GeminiPlugin, LowLevelZeroPlugin

from ..booster.toy_loop import train_toy
from ..zero import toy


@dataclass(frozen=True)
class Run:
    plugin: str  # "zero2" or "gemini"
    cpu_offload: bool = False  # zero2
    frac: float = 0.0  # gemini: offload_optim_frac
    param_frac: float = 0.0  # gemini: offload_param_frac
    overlap_gather: bool = False  # zero2: overlap_allgather
    nvme: str = ""  # zero2: swap root for states on NVMe
    steps: int = 10
    save_at: int = 0
    save_dir: str = ""
    resume: str = ""


def make_plugin(run: Run):
    if run.plugin == "gemini":
        return GeminiPlugin(
            precision="fp32", offload_optim_frac=run.frac, offload_param_frac=run.param_frac
        )
    plugin = LowLevelZeroPlugin(
        stage=2,
        precision="fp32",
        cpu_offload=run.cpu_offload,
        overlap_allgather=run.overlap_gather,
    )
    if run.nvme:
        plugin.set_offload(tier="nvme", swap_dir=run.nvme, run_name="booster")
    return plugin


def train(rank: int, run: Run):
    """Rank 0 returns (per-step losses, tiers of the trainable chunks)."""
    model = toy.make_model(5)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    booster = Booster(plugin=make_plugin(run))
    model, opt, *_ = booster.boost(model, opt)
    losses = train_toy(rank, booster, model, opt, run)
    tiers = [c.tier for c in opt.zero_optimizer.chunks if c.trainable]
    opt.zero_optimizer.close()
    return (losses, tiers) if rank == 0 else None
