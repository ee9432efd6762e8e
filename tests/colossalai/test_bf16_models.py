"""Models built in bf16 (torch_dtype=torch.bfloat16, as ColossalAI's llama benchmark
builds them): HybridAdam steps their parameters in fp32 math with bf16 states (ColossalAI's
HybridAdam), TorchFSDPPlugin steps them (and FSDP2's DTensor shards) with it, its CPU
offload runs on CPU ranks, and HybridParallelPlugin at zero_stage 0 (tp or pp) trains
them through fp32 masters. Against plain torch in one process (bf16_workers.py)."""

from __future__ import annotations

import pytest
import torch

from megalith.nn.optimizer import HybridAdam
from megalith.testing import run_distributed
from tests.colossalai import bf16_workers as bw


def _within_one_bf16_step(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal within one bf16 step elementwise; near 0, where the update cancels the value,
    within the fp32 arithmetic's error of the largest value."""
    a, b = a.float(), b.float()
    bound = 2**-7 * torch.maximum(a.abs(), b.abs()) + 2**-16 * b.abs().max()
    return bool(((a - b).abs() <= bound).all())


def test_hybrid_adam_steps_bf16_parameters_as_colossalai(gen):
    shapes = [(7, 5), (33,), (4, 4, 3)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(torch.bfloat16)) for s in shapes]
    ref = [p.detach().clone() for p in params]
    opt = HybridAdam(params, lr=bw.LR, betas=bw.BETAS, eps=bw.EPS, weight_decay=0.0)
    states: list[dict] = [{} for _ in params]
    for _ in range(bw.STEPS):
        grads = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        with torch.no_grad():
            for r, g, st in zip(ref, grads, states):
                bw.colossal_bf16_adam(r, g, st)
    for p, r, st in zip(params, ref, states):
        assert p.dtype == torch.bfloat16
        # fp32 updates rounded to bf16: equal but where the two fp32 results straddle a
        # rounding boundary (one bf16 step)
        assert (p.detach() != r).float().mean() < 0.1
        assert _within_one_bf16_step(p.detach(), r)
        s = opt.state[p]
        assert s["exp_avg"].dtype == torch.bfloat16 and float(s["step"]) == bw.STEPS
        # the moments cancel towards 0: bounded relative to the largest one
        m_err = (s["exp_avg"].float() - st["m"].float()).abs().max()
        assert m_err <= 2**-6 * st["m"].float().abs().max()


@pytest.mark.timeout(120)
def test_bf16_models_under_fsdp_and_hybrid_zero0_match_torch():
    for errors in run_distributed(bw.bf16_grid, 2, 11, timeout=110):
        assert errors == []
