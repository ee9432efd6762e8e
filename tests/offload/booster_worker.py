"""Booster plugins with offloading, on the toy model (what each rank runs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import megalith_comm as comm
from megalith.booster import Booster, GeminiPlugin, LowLevelZeroPlugin

from ..zero import toy


@dataclass(frozen=True)
class Run:
    plugin: str  # "zero2" or "gemini"
    cpu_offload: bool = False  # zero2
    frac: float = 0.0  # gemini: offload_optim_frac
    nvme: str = ""  # zero2: swap root for states on NVMe
    steps: int = 10
    save_at: int = 0
    save_dir: str = ""
    resume: str = ""


def make_plugin(run: Run):
    if run.plugin == "gemini":
        return GeminiPlugin(precision="fp32", offload_optim_frac=run.frac)
    plugin = LowLevelZeroPlugin(stage=2, precision="fp32", cpu_offload=run.cpu_offload)
    if run.nvme:
        plugin.set_offload(tier="nvme", swap_dir=run.nvme, run_name="booster")
    return plugin


def train(rank: int, run: Run):
    """Rank 0 returns (per-step losses, tiers of the trainable chunks)."""
    n = comm.get_world().world_size
    model = toy.make_model(5)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    booster = Booster(plugin=make_plugin(run))
    model, opt, *_ = booster.boost(model, opt)
    first = 0
    if run.resume:
        booster.load_model(model, f"{run.resume}/model")
        booster.load_optimizer(opt, f"{run.resume}/optim")
        first = run.save_at
    rows = toy.BATCH // n
    losses = []
    for step, micro in enumerate(toy.batches(5, run.steps, 1)[first:], start=first + 1):
        x, y = micro[0]
        loss = toy.loss_fn(
            model, x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]
        )
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        t = loss.detach().double()
        comm.all_reduce(t, op="avg")
        losses.append(float(t))
        if step == run.save_at and run.save_dir:
            booster.save_model(model, f"{run.save_dir}/model", shard=True, size_per_shard=1)
            booster.save_optimizer(opt, f"{run.save_dir}/optim", shard=True, size_per_shard=1)
    tiers = [c.tier for c in opt.optim.chunks if c.trainable]
    opt.optim.close()
    return (losses, tiers) if rank == 0 else None
