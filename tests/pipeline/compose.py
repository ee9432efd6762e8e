"""Pipeline parallelism composed with data parallelism over the mesh's dp axis: gradients
averaged by the pipeline itself, or by megalith_zero's stage 1 (which the pipeline drives
through its no_sync). Checked against the whole model on the whole batch, one process."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import megalith_comm as comm
import megalith_zero as zero
from megalith_pipeline import Pipeline, as_layers

from .checks import RTOL, SGD, _pairs, build, close, loss_fn

PER_DP = 5  # samples per data-parallel rank per step; micro-batches of 2 and 3


@dataclass(frozen=True)
class Compose:
    schedule: str
    model: str  # mlp, mixed or gpt2
    zero: bool  # ZeRO stage 1 (AdamW) instead of the pipeline's own averaging (SGD)
    pp: int = 2
    dp: int = 2
    steps: int = 2


def _batch(model: str, step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(500 + step)
    if model == "gpt2":
        return torch.randint(0, 32, (n, 8), generator=g), torch.randint(0, 32, (n, 8), generator=g)
    return torch.randn(n, 4, generator=g), torch.randn(n, 3, generator=g)


def check_composed(rank: int, case: Compose) -> dict:
    torch.set_num_threads(1)
    mesh = comm.Mesh(None, pp=case.pp, dp=case.dp)
    d = mesh.coord("dp")
    ref = build(case.model, 8)
    model = build(case.model, 8)
    pipe = Pipeline(
        model, num_microbatches=2, schedule=case.schedule, mesh=mesh, loss_fn=loss_fn(case.model)
    )
    if case.zero:
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        opt = torch.optim.AdamW(pipe.module.parameters(), lr=1e-2)
        _, zopt = zero.shard(pipe.module, opt, zero.ZeroConfig(stage=1), mesh=mesh, axis="dp")
    else:
        ref_opt, zopt = SGD(list(ref.parameters())), None
        opt = SGD(list(pipe.module.parameters()))
    pairs = _pairs(pipe, as_layers(ref))
    worst = 0.0
    for step in range(case.steps):
        x, y = _batch(case.model, step, PER_DP * case.dp)
        ref_loss = loss_fn(case.model)(ref(x), y)
        ref_loss.backward()
        mine = slice(d * PER_DP, (d + 1) * PER_DP)
        loss = pipe.step(x[mine], y[mine], no_sync=zopt.no_sync if zopt else None)
        if pipe.is_last:  # this replica's loss; their mean is the reference's
            t = loss.reshape(1).clone()
            comm.all_reduce(t, op="avg", group=mesh.group("dp"))
            worst = max(worst, close(t[0], ref_loss.detach()))
        if zopt is None:
            for name, p, q in pairs:
                err = close(p.grad, q.grad)
                assert err <= RTOL, f"{case} step {step}: grad of {name}: {err:.2e}"
                worst = max(worst, err)
            opt.step()
            opt.zero_grad()
        else:
            zopt.step()
            zopt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        for name, p, q in pairs:
            err = close(p.detach(), q.detach())
            assert err <= RTOL, f"{case} step {step}: {name} after the step: {err:.2e}"
            worst = max(worst, err)
    return {"worst": worst}
