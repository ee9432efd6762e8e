"""state_dict layout equal to torch's: checkpoints move both ways."""

from __future__ import annotations

import pytest
import torch

from megalith.optim import CPUSGD, CPUAdam, HybridAdam


def model(gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def train(m, opt, data, steps):
    for x, y in data[:steps]:
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()


def batches(gen, k=8):
    return [(torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(k)]


@pytest.mark.parametrize(
    "ours_cls,torch_cls,kw",
    [
        (CPUAdam, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.01)),
        (HybridAdam, torch.optim.Adam, dict(lr=1e-2, amsgrad=True)),
        (CPUSGD, torch.optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True)),
    ],
)
def test_round_trip_both_ways(ours_cls, torch_cls, kw, gen):
    data = batches(gen)
    extra = {} if torch_cls is not torch.optim.Adam else {"adamw_mode": False}
    # torch for 4 steps -> ours for 4 steps  ==  torch for 8 steps
    m_ref = model(gen)
    m_mix = model(gen)
    m_mix.load_state_dict(m_ref.state_dict())
    m_back = model(gen)
    m_back.load_state_dict(m_ref.state_dict())

    ref_opt = torch_cls(m_ref.parameters(), foreach=False, **kw)
    train(m_ref, ref_opt, data, 8)

    first = torch_cls(m_mix.parameters(), foreach=False, **kw)
    train(m_mix, first, data, 4)
    second = ours_cls(m_mix.parameters(), **kw, **extra)
    second.load_state_dict(first.state_dict())
    train(m_mix, second, data[4:], 4)
    for a, b in zip(m_mix.parameters(), m_ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    # ours for 4 steps -> torch for 4 steps
    o1 = ours_cls(m_back.parameters(), **kw, **extra)
    train(m_back, o1, data, 4)
    sd = o1.state_dict()
    if torch_cls is not torch.optim.SGD:
        assert set(sd["state"][0]) >= {"step", "exp_avg", "exp_avg_sq"}
        assert sd["state"][0]["step"].dtype == torch.float32
    o2 = torch_cls(m_back.parameters(), foreach=False, **kw)
    o2.load_state_dict(sd)
    train(m_back, o2, data[4:], 4)
    for a, b in zip(m_back.parameters(), m_ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
