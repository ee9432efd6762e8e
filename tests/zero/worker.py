"""What each rank runs in the ZeRO tests (module-level, so spawned ranks can import it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import megalith_comm as comm
import megalith_zero as zero

from . import toy


@dataclass(frozen=True)
class Case:
    stage: int
    precision: str = "fp32"
    accumulate: int = 1
    no_sync: bool = False
    max_norm: float | None = None
    steps: int = 20
    seed: int = 0
    chunk_bytes: int = 2048  # small: many chunks, shards cut through parameters
    save_after: int = 0  # steps after which to save_sharded into save_dir (0: never)
    save_dir: str = ""
    resume: str = ""  # a sharded checkpoint to load first
    full: bool = False  # save/resume with the layout-free full files instead
    first_step: int = 0  # the step the data starts at (after a resume)


def train(rank: int, case: Case):
    """Trains the toy model under ZeRO; returns (losses, full fp32 params) on rank 0."""
    world = comm.get_world()
    n = world.world_size
    model = toy.make_model(case.seed)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    zmodel, zopt = zero.shard(
        model,
        opt,
        zero.ZeroConfig(stage=case.stage, precision=case.precision, chunk_bytes=case.chunk_bytes),
    )
    if case.resume and case.full:
        zero.load_full(zmodel, zopt, case.resume)
        zero.load_full_optimizer(zmodel, zopt, case.resume)
    elif case.resume:
        zero.load_sharded(zmodel, zopt, case.resume)
    rows = toy.BATCH // n
    losses = []
    data = toy.batches(case.seed, case.steps, case.accumulate)[case.first_step :]
    for step, micro in enumerate(data, start=case.first_step + 1):
        total = torch.zeros((), dtype=torch.float64)
        for i, (x, y) in enumerate(micro):
            xs, ys = x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]
            loss = toy.loss_fn(zmodel, xs, ys) / case.accumulate
            if case.no_sync and i < case.accumulate - 1:
                with zopt.no_sync():
                    zopt.backward(loss)
            else:
                zopt.backward(loss)
            total += float(loss.detach())
        if case.max_norm is not None:
            zopt.clip_grad_norm_(case.max_norm)
        zopt.step()
        zopt.zero_grad()
        comm.all_reduce(total, op="avg")
        losses.append(float(total))
        if step == case.save_after and case.full:
            zero.save_full(zmodel, case.save_dir, max_shard_bytes=3000)
            zero.save_full_optimizer(zmodel, zopt, case.save_dir, max_shard_bytes=3000)
        elif step == case.save_after:
            zero.save_sharded(zmodel, zopt, case.save_dir)
    state = zmodel.full_state_dict()
    return (losses, {k: v for k, v in state.items()}) if rank == 0 else None
