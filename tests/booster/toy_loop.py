"""The toy model's training loop under a boosted model and optimizer, shared by the
Booster workers: resume from a checkpoint, train, save at a step; rank 0's losses."""

from __future__ import annotations

from typing import Any

import megalith_comm as comm

from ..zero import toy


def train_toy(rank: int, booster: Any, model: Any, opt: Any, run: Any, sched: Any = None):
    """run: steps, save_at, save_dir, resume. Returns every rank's view of the per-step
    losses (averaged over ranks), from the step after save_at when resuming."""
    n = comm.get_world().world_size
    first = 0
    if run.resume:
        booster.load_model(model, f"{run.resume}/model")
        booster.load_optimizer(opt, f"{run.resume}/optim")
        if sched is not None:
            booster.load_lr_scheduler(sched, f"{run.resume}/sched.json")
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
        if sched is not None:
            sched.step()
        t = loss.detach().double()
        comm.all_reduce(t, op="avg")
        losses.append(float(t))
        if step == run.save_at and run.save_dir:
            booster.save_model(model, f"{run.save_dir}/model", shard=True, size_per_shard=1)
            booster.save_optimizer(opt, f"{run.save_dir}/optim", shard=True, size_per_shard=1)
            if sched is not None:
                booster.save_lr_scheduler(sched, f"{run.save_dir}/sched.json")
    return losses
