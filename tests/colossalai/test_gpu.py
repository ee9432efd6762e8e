"""ColossalAI's surface on a CUDA GPU (skipped without one): the CUDA accelerator,
megalith.nn.optimizer's CUDA steps against torch, and a BatchNorm net under bf16 ZeRO on
one GPU rank (the buffer-dtype bug's GPU form)."""

from __future__ import annotations

import os

import pytest
import torch

from megalith.testing import run_distributed
from tests.support.gpu import gpu

pytestmark = gpu


def test_cuda_accelerator_reports_the_device():
    from megalith.accelerator import get_accelerator

    acc = get_accelerator()
    assert acc.name == "cuda"
    assert acc.get_current_device().type == "cuda"
    assert acc.device_count() == torch.cuda.device_count()
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    x = torch.empty(64 << 20, dtype=torch.uint8, device=acc.get_current_device())
    assert acc.memory_allocated() - before >= 64 << 20
    assert acc.max_memory_allocated() >= acc.memory_allocated()
    del x
    acc.synchronize()
    acc.empty_cache()
    acc.manual_seed(5)
    a = torch.randn(8, device="cuda")
    acc.manual_seed(5)
    assert torch.equal(a, torch.randn(8, device="cuda"))


@pytest.mark.parametrize("name", ["HybridAdam", "CPUAdam", "FusedAdam"])
def test_adam_family_on_cuda_matches_torch(name):
    import megalith.nn.optimizer as nn_opt

    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    shapes = [(257, 33), (33,), (1000, 64), (7,)]
    ours = [torch.randn(s, generator=gen, device="cuda") for s in shapes]
    ref = [p.clone() for p in ours]
    for p in ours + ref:
        p.requires_grad_(True)
    opt = getattr(nn_opt, name)(ours, lr=1e-2, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    for _ in range(20):
        grads = [torch.randn(s, generator=gen, device="cuda") for s in shapes]
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _bn_net_bf16(rank: int) -> list[float]:
    from megalith.booster import Booster, LowLevelZeroPlugin

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 10),
    ).cuda()  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    booster = Booster(plugin=LowLevelZeroPlugin(stage=2, precision="bf16"))
    model, opt, *_ = booster.boost(model, opt)
    losses = []
    for _ in range(3):
        x = torch.randn(4, 3, 16, 16, device="cuda")
        y = torch.randint(0, 10, (4,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses


def test_batchnorm_net_trains_under_bf16_zero_on_gpu():
    losses = run_distributed(_bn_net_bf16, 1, timeout=180, backend="nccl")[0]
    assert all(torch.isfinite(torch.tensor(losses))), losses
