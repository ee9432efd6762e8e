"""What each rank checks: a pipeline step against the same model run whole, in one process.

Every rank builds the model twice from one seed: the reference runs the whole
batch in one forward and backward, then an SGD step; the pipeline runs its
stages of the copy. Each rank compares the loss (on the loss rank), the gradient
of every parameter it holds and the parameter after the step, with the
reference's, within fp32's 1e-5 relative.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import megalith_comm as comm
from megalith_pipeline import Pipeline, as_layers

from . import models

RTOL = 1e-5


@dataclass(frozen=True)
class Case:
    schedule: str
    m: int  # micro-batches
    model: str = "mlp"  # mlp, mixed or gpt2
    layers: int = 8
    batch: int = 0  # 0: 2 * m + 1, so micro-batches differ in size
    chunks: int | None = None
    balance: str = "layers"
    steps: int = 1


class SGD:
    """SGD with momentum, as torch.optim.SGD computes it. (torch.optim's first use imports
    torch._dynamo: seconds per spawned rank on a busy 2-core machine.)"""

    def __init__(self, params: list[nn.Parameter], lr: float = 0.1, momentum: float = 0.9):
        self.params, self.lr, self.momentum = params, lr, momentum
        self.bufs: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            buf = self.bufs.get(id(p))
            buf = p.grad.clone() if buf is None else buf.mul_(self.momentum).add_(p.grad)
            self.bufs[id(p)] = buf
            p.add_(buf, alpha=-self.lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def build(kind: str, layers: int, seed: int = 0) -> nn.Module:
    return {"mlp": models.mlp, "mixed": models.mixed, "gpt2": models.tiny_gpt2}[kind](layers, seed)


def data(case: Case, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    n = case.batch or 2 * case.m + 1
    if case.model == "gpt2":
        ids = torch.randint(0, 32, (n, 8), generator=g)
        return ids, torch.randint(0, 32, (n, 8), generator=g)
    return torch.randn(n, 4, generator=g), torch.randn(n, 3, generator=g)


def loss_fn(kind: str):
    if kind == "gpt2":
        return lambda out, y: nn.functional.cross_entropy(
            out.reshape(-1, out.shape[-1]), y.reshape(-1)
        )
    return nn.functional.mse_loss


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b| (the error in units of the tensor's scale)."""
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / max(scale, 1e-12)


def check_against_reference(rank: int, case: Case, mesh: comm.Mesh | None = None) -> dict:
    """Runs case.steps pipeline steps and the reference; raises on a mismatch.

    Returns {"loss": [...] on the loss rank, "errors": worst relative errors}.
    """
    torch.set_num_threads(1)  # tiny tensors; ranks share two cores
    ref = build(case.model, case.layers)
    ref_layers = as_layers(ref)
    ref_opt = SGD(list(ref.parameters()))
    model = build(case.model, case.layers)
    pipe = Pipeline(
        model,
        num_microbatches=case.m,
        schedule=case.schedule,
        chunks=case.chunks,
        mesh=mesh,
        balance=case.balance,
        loss_fn=loss_fn(case.model),
    )
    opt = SGD(list(pipe.module.parameters()))
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0}
    losses = []
    for step in range(case.steps):
        x, y = data(case, step)
        ref_loss = loss_fn(case.model)(ref(x), y)
        ref_loss.backward()
        loss = pipe.step(x, y)
        if pipe.is_last:
            worst["loss"] = max(worst["loss"], close(loss, ref_loss.detach()))
            losses.append(loss.item())
        else:
            assert loss is None
        pairs = _pairs(pipe, ref_layers)
        for name, p, q in pairs:
            assert p.grad is not None, f"{case}: {name} has no gradient on pp rank {pipe.rank}"
            worst["grad"] = max(worst["grad"], close(p.grad, q.grad))
            assert close(p.grad, q.grad) <= RTOL, (
                f"{case} step {step}: grad of {name}: {close(p.grad, q.grad):.2e}"
            )
        ref_opt.step()
        opt.step()
        ref_opt.zero_grad()
        opt.zero_grad()
        for _, p, q in pairs:
            worst["param"] = max(worst["param"], close(p.detach(), q.detach()))
    assert worst["loss"] <= RTOL and worst["param"] <= RTOL, f"{case}: {worst}"
    return {"loss": losses, "errors": worst, "sizes": pipe.partition.sizes}


def _pairs(
    pipe: Pipeline, ref_layers: list[nn.Module]
) -> list[tuple[str, nn.Parameter, nn.Parameter]]:
    """(name, pipeline parameter, reference parameter) for every parameter on this rank."""
    out, seen = [], set()
    for stage in pipe.module:
        for layer, idx in zip(stage.layers, stage.layer_ids):
            for (name, p), (_, q) in zip(
                layer.named_parameters(), ref_layers[idx].named_parameters()
            ):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((f"layer {idx} {name}", p, q))
    return out
