"""The small model the asynchronous-save tests train: ZeRO-2 with host offload on CPU
ranks, and a reader for the safetensors a save wrote."""

from __future__ import annotations

from pathlib import Path

import torch


def saved_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the .safetensors files in `directory`, by name."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def boosted(with_scheduler: bool = False) -> tuple:
    """(booster, model, optimizer[, scheduler]): a 16-32-4 MLP under LowLevelZero stage 2,
    fp32, cpu_offload; seeded, so every rank and every call builds the same one."""
    from megalith.booster import Booster, LowLevelZeroPlugin

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    booster = Booster(plugin=LowLevelZeroPlugin(stage=2, precision="fp32", cpu_offload=True))
    if not with_scheduler:
        model, optimizer, *_ = booster.boost(model, optimizer)
        return booster, model, optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    return booster, model, optimizer, scheduler


def train_step(booster, model, optimizer, x: torch.Tensor) -> float:
    loss = model(x).square().mean()
    booster.backward(loss, optimizer)
    optimizer.step()
    optimizer.zero_grad()
    return float(loss)
