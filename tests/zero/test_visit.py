"""megalith_offload's DeviceVisits on its own (CPU ranks: the slots are CPU memory): a
visiting chunk's master and states go through a slot and come back updated exactly as
the same update in place would leave them, with more chunks than slots and chunks
smaller than a slot. The training-level tests are in tests/offload/test_zero.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from megalith_core.memory import StateMemory
from megalith_offload.visit import DeviceVisits
from tests.support.gpu import gpu

NAMES = ("exp_avg", "exp_avg_sq")


def chunk(n: int, seed: int) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(
        master=torch.randn(n, generator=g),
        states={name: torch.rand(n, generator=g) for name in NAMES},
        grad=torch.randn(n, generator=g),
        shard=torch.zeros(n, dtype=torch.bfloat16),
    )


def update(c: SimpleNamespace, master: torch.Tensor, states: dict[str, torch.Tensor]) -> None:
    """An Adam-shaped update that reads and writes every buffer."""
    states["exp_avg"].mul_(0.9).add_(c.grad, alpha=0.1)
    states["exp_avg_sq"].mul_(0.99).addcmul_(c.grad, c.grad, value=0.01)
    master.addcdiv_(states["exp_avg"], states["exp_avg_sq"].sqrt().add_(1e-8), value=-1e-3)
    c.shard.copy_(master)


def test_visits_equal_the_update_in_place():
    sizes = (1000, 7, 1000, 513, 999)
    visiting = [chunk(n, i) for i, n in enumerate(sizes)]
    in_place = [chunk(n, i) for i, n in enumerate(sizes)]
    memory = StateMemory(torch.device("cpu"))
    visits = DeviceVisits(max(sizes), NAMES, memory, None, slots=2)
    assert visits.slot_bytes == 3 * 4 * max(sizes)
    assert memory.usage("optim_states").current_bytes == 2 * 2 * 4 * max(sizes)
    for _ in range(3):  # slots reused across chunks and steps
        for c in visiting:
            visits.submit(c, NAMES, lambda m, s, c=c: update(c, m, s))
        visits.wait()
        for c in in_place:
            update(c, c.master, c.states)
    for v, p in zip(visiting, in_place):
        assert torch.equal(v.master, p.master)
        assert torch.equal(v.shard, p.shard)
        for name in NAMES:
            assert torch.equal(v.states[name], p.states[name])


@gpu
def test_visits_on_cuda_equal_the_update_in_place():
    """CUDA: masters and states in page-locked host memory, gradients and working params
    on the GPU, the update on a side stream; slower copies than updates must not let a
    slot be overwritten before its copy down."""
    dev = torch.device("cuda")
    host = StateMemory.host(pinned=True)
    sizes = (1 << 20, 7, 1 << 20, 513, (1 << 20) - 1)

    def on_gpu(c: SimpleNamespace) -> SimpleNamespace:
        master = host.empty("master", c.master.numel())
        master.copy_(c.master)
        states = {}
        for name in NAMES:
            states[name] = host.empty("optim_states", c.master.numel())
            states[name].copy_(c.states[name])
        return SimpleNamespace(
            master=master, states=states, grad=c.grad.to(dev), shard=c.shard.to(dev)
        )

    reference = [chunk(n, i) for i, n in enumerate(sizes)]
    visiting = [on_gpu(c) for c in reference]
    memory = StateMemory(dev)
    visits = DeviceVisits(max(sizes), NAMES, memory, torch.cuda.Stream(dev), slots=2)
    for _ in range(3):
        for c in visiting:
            visits.submit(c, NAMES, lambda m, s, c=c: update(c, m, s))
        visits.wait()
        for c in reference:
            update(c, c.master, c.states)
    torch.cuda.synchronize()
    for v, r in zip(visiting, reference):
        assert torch.allclose(v.master, r.master, rtol=1e-6, atol=1e-7)
        assert torch.allclose(v.shard.cpu().float(), r.shard.float(), rtol=1e-2)
        for name in NAMES:
            assert torch.allclose(v.states[name], r.states[name], rtol=1e-6, atol=1e-7)
