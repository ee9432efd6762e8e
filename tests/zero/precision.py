"""Workers for the bf16/fp16 tests."""

from __future__ import annotations

import torch

import megalith_comm as comm
import megalith_zero as zero

from . import toy


def fp16_overflow(rank: int, stage: int):
    """fp16 with a loss made infinite at steps 3 and 4: those steps must change nothing,
    and the loss scale must follow GradScaler's rules exactly."""
    n = comm.get_world().world_size
    model = toy.make_model(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = zero.ZeroConfig(
        stage=stage,
        precision="fp16",
        chunk_bytes=1024,
        loss_scale=zero.LossScaleConfig(initial=1024.0, growth_interval=2),
    )
    zmodel, zopt = zero.shard(model, opt, cfg)
    rows = toy.BATCH // n
    scales, stepped, unchanged = [], [], []
    for step, micro in enumerate(toy.batches(1, 7, 1), start=1):
        x, y = micro[0]
        loss = toy.loss_fn(
            zmodel, x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]
        )
        if step in (3, 4) and rank == n - 1:  # one rank overflows: every rank must skip
            loss = loss * float("inf")
        before = zmodel.full_state_dict()
        zopt.backward(loss)
        stepped.append(zopt.step())
        zopt.zero_grad()
        after = zmodel.full_state_dict()
        unchanged.append(all(torch.equal(before[k], after[k]) for k in before))
        scales.append(zopt.loss_scale)
    return scales, stepped, unchanged


def mixed(rank: int, setting: tuple[int, str]):
    stage, precision = setting
    model = toy.make_model(2)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    # A loss scale that cannot overflow here: the reference does not skip steps.
    cfg = zero.ZeroConfig(
        stage=stage,
        precision=precision,
        chunk_bytes=1024,
        loss_scale=zero.LossScaleConfig(initial=256.0, growth_interval=10**6),
    )
    zmodel, zopt = zero.shard(model, opt, cfg)
    assert all(p.dtype == zopt.config.param_dtype for p in model.parameters())
    losses = []
    for micro in toy.batches(2, 20, 1):
        losses.append(toy.zero_step(zmodel, zopt, *micro[0]))
    state = zmodel.full_state_dict()
    assert zopt.skipped_steps == 0
    return (losses, state) if rank == 0 else None
