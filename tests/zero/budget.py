"""Worker for the memory-budget test: model-state bytes per kind after a few steps."""

from __future__ import annotations

import torch
from torch import nn

import megalith_comm as comm
import megalith_zero as zero


def model_state_bytes(rank: int, stage: int):
    torch.manual_seed(0)
    layers = [nn.Linear(61, 61) for _ in range(8)]  # 3782 params each, nothing divides evenly
    model = nn.Sequential(*[m for layer in layers for m in (layer, nn.Tanh())])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    zmodel, zopt = zero.shard(
        model, opt, zero.ZeroConfig(stage=stage, precision="bf16", chunk_bytes=8192, prefetch=1)
    )
    g = torch.Generator().manual_seed(rank)
    zmodel.memory.reset_peak()
    for _ in range(3):
        x = torch.randn(16, 61, generator=g)
        zopt.backward(zmodel(x).float().pow(2).mean())
        zopt.step()
        zopt.zero_grad()
    report = zmodel.memory_report()
    chunk_numels = [c.spec.numel for c in zmodel.chunks]
    real = sum(p.numel() for p in model.parameters())
    comm.barrier()
    return {k: (u.current_bytes, u.peak_bytes) for k, u in report.items()}, chunk_numels, real
