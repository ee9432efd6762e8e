"""What each rank runs in the Booster tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from megalith.booster import Booster, TorchDDPPlugin

from ..zero import toy
from .toy_loop import train_toy


@dataclass(frozen=True)
class Run:
    plugin: str  # "ddp", "zero1", "zero2", "gemini"
    precision: str = "fp32"
    steps: int = 12
    save_at: int = 0
    save_dir: str = ""
    resume: str = ""


def train(rank: int, run: Run):
    """The toy model under a Booster plugin; rank 0 returns the per-step losses."""
    model = toy.make_model(5)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    # The toy model has a parameter it never uses: torch's DDP must be told; ZeRO needs no flag.
    plugin = TorchDDPPlugin(find_unused_parameters=True) if run.plugin == "ddp" else run.plugin
    booster = Booster(plugin=plugin, mixed_precision=run.precision)
    model, opt, _, _, sched = booster.boost(model, opt, lr_scheduler=sched)
    losses = train_toy(rank, booster, model, opt, run, sched)
    return losses if rank == 0 else None


def plain_torch_losses(run: Run) -> list[float]:
    """The toy model's per-step losses in plain single-process torch (no Booster)."""
    model = toy.make_model(5)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    losses = []
    for micro in toy.batches(5, run.steps, 1):
        loss = toy.loss_fn(model, *micro[0])
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(float(loss.detach().double()))
    return losses


def wraps_ddp(rank: int) -> str:
    """The class under the Booster's model wrapper for TorchDDPPlugin at this world size."""
    booster = Booster(plugin=TorchDDPPlugin())
    model, *_ = booster.boost(toy.make_model(5))
    return type(model.module).__name__
