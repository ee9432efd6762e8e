"""What each rank runs in tests/zero/test_lean_chunk_states.py (importable by spawned ranks)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

import megalith_comm as comm
import megalith_zero as zero
from megalith.optim import CPUAdam, HybridAdam

from . import toy

LR = 1e-2


@dataclass(frozen=True)
class LeanCase:
    state_dtype: str  # "fp32", "bf16" or "int8"
    stage: int = 2
    steps: int = 20
    seed: int = 0
    shard_each_param: bool = False
    aligned: bool = False  # the Aligned model instead of the toy
    chunk_bytes: int = 2048
    offload: str = ""  # "", "host" or "nvme"
    save_after: int = 0  # steps after which to save into save_dir (0: never)
    save_dir: str = ""
    resume: str = ""  # a checkpoint to load first
    full: bool = False  # the layout-free full files instead of the sharded ones
    first_step: int = 0


class Aligned(torch.nn.Module):
    """Parameters of 512 and 1024 elements: whole q8 blocks and whole SIMD vectors, so a
    chunk's shard and a per-parameter optimizer cut the same blocks and tails."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32, bias=False)
        self.b = torch.nn.Linear(32, 32, bias=False)
        self.c = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def _model_and_data(case: LeanCase):
    if not case.aligned:
        return (
            toy.make_model(case.seed),
            [m[0] for m in toy.batches(case.seed, case.steps, 1)],
            toy.loss_fn,
        )
    torch.manual_seed(case.seed)
    model = Aligned()
    g = torch.Generator().manual_seed(case.seed + 1)
    data = [
        (torch.randn(12, 16, generator=g), torch.randn(12, 16, generator=g))
        for _ in range(case.steps)
    ]
    return model, data, lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)


def _config(case: LeanCase) -> zero.ZeroConfig:
    offload = None
    if case.offload:
        from megalith_offload import OffloadConfig

        offload = OffloadConfig(tier=case.offload, direct=False)
    return zero.ZeroConfig(
        stage=case.stage,
        chunk_bytes=case.chunk_bytes,
        shard_each_param=case.shard_each_param,
        offload=offload,
    )


def train(rank: int, case: LeanCase):
    """The toy model under ZeRO with HybridAdam(state_dtype=...); on rank 0: (losses,
    full fp32 params, the chunks' optimizer-state bytes from the engine's accounting and
    as counted from the shards' specs)."""
    n = comm.get_world().world_size
    model = toy.make_model(case.seed)
    opt = HybridAdam(toy.param_groups(model, 0.1), lr=LR, state_dtype=case.state_dtype, seed=7)
    zmodel, zopt = zero.shard(model, opt, _config(case))
    if case.resume and case.full:
        zero.load_full(zmodel, zopt, case.resume)
        zero.load_full_optimizer(zmodel, zopt, case.resume)
    elif case.resume:
        zero.load_sharded(zmodel, zopt, case.resume)
    rows = toy.BATCH // n
    losses = []
    data = toy.batches(case.seed, case.steps, 1)[case.first_step :]
    for step, micro in enumerate(data, start=case.first_step + 1):
        x, y = micro[0]
        loss = toy.loss_fn(
            zmodel, x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]
        )
        zopt.backward(loss)
        zopt.step()
        zopt.zero_grad()
        total = loss.detach().double()
        comm.all_reduce(total, op="avg")
        losses.append(float(total))
        if step == case.save_after and case.full:
            zero.save_full(zmodel, case.save_dir, max_shard_bytes=3000)
            zero.save_full_optimizer(zmodel, zopt, case.save_dir, max_shard_bytes=3000)
        elif step == case.save_after:
            zero.save_sharded(zmodel, zopt, case.save_dir)
    state = zmodel.full_state_dict()
    report = dict(zmodel.memory_report())
    for tier in zopt.tiers:
        report.update(tier.report())
    counted = sum(t.numel() * t.element_size() for c in zopt.trainable for t in c.states.values())
    zopt.close()
    return (losses, dict(state), report, counted) if rank == 0 else None


def _same_grads(zopt, plain: torch.nn.Module) -> None:
    """The plain copy's gradients := the chunks' reduced ones (world 1: the whole
    gradient), so that the two steps see the same input bit for bit (autograd and the
    chunks sum a tied weight's two uses in different orders)."""
    zopt.reducer.wait()
    params = dict(plain.named_parameters())
    for c in zopt.trainable:
        for seg in c.spec.segments(0):
            p = params[seg.slot.name]
            if not c.used[c.spec.slots.index(seg.slot)]:
                p.grad = None
                continue
            g = c.shard_grad[seg.shard_start : seg.shard_start + seg.length]
            p.grad = g.float().view(p.shape).clone()


def chunk_and_reference(rank: int, case: LeanCase):
    """World 1: the ZeRO chunk step and CPUAdam(state_dtype=...) on a plain copy of the
    same model, step by step; returns per step (chunk params, reference params) and the
    final (chunk states per parameter, reference states)."""
    model, data, loss_fn = _model_and_data(case)
    plain = copy.deepcopy(model)
    opt = HybridAdam(toy.param_groups(model, 0.1), lr=LR, state_dtype=case.state_dtype, seed=7)
    ref_opt = CPUAdam(toy.param_groups(plain, 0.1), lr=LR, state_dtype=case.state_dtype, seed=7)
    zmodel, zopt = zero.shard(model, opt, _config(case))
    out = []
    for x, y in data:
        zopt.backward(loss_fn(zmodel, x, y))
        _same_grads(zopt, plain)
        zopt.step()
        zopt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        out.append(
            (
                {k: v.clone() for k, v in zmodel.full_state_dict().items()},
                {k: v.detach().clone() for k, v in plain.named_parameters()},
            )
        )
    names = {id(p): k for k, p in plain.named_parameters()}
    ref_states = {names[id(p)]: dict(s) for p, s in ref_opt.state.items()}
    chunk_states = {}
    for c in zopt.trainable:
        for seg in c.spec.segments(0):
            sl = slice(seg.shard_start, seg.shard_start + seg.length)
            chunk_states[seg.slot.name] = {n: t for n, t in c.states.items()}, sl
    return out, ref_states, chunk_states
