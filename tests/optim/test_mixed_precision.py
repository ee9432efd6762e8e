"""The one-pass mixed-precision step: fp32 master and states, bf16/fp16
gradients, loss-scale unscaling, inf/nan detection and a bf16/fp16 param copy."""

from __future__ import annotations

import pytest
import torch

from megalith.optim import functional as F


def make(n, gen, grad_dtype):
    p = torch.randn(n, generator=gen)
    g = (torch.randn(n, generator=gen) * 1e-2).to(grad_dtype)
    return p, g, torch.zeros(n), torch.zeros(n)


@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("copy_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_grads_and_copy(grad_dtype, copy_dtype, simd_level, gen):
    n = 10_007
    p, g, m, v = make(n, gen, grad_dtype)
    ref = torch.nn.Parameter(p.double())
    opt = torch.optim.AdamW([ref], lr=1e-3, weight_decay=0.01, foreach=False)
    copy = torch.empty(n, dtype=copy_dtype)
    loss_scale = 1024.0
    for step in range(1, 11):
        g_scaled = (g.float() * loss_scale).to(grad_dtype)  # what backward under a loss scale gives
        found = F.adam_step(
            [p],
            [g_scaled],
            [m],
            [v],
            param_copies=[copy],
            step=step,
            lr=1e-3,
            weight_decay=0.01,
            grad_scale=1.0 / loss_scale,
            nonfinite="detect",
        )
        assert found is False
        ref.grad = g_scaled.double() / loss_scale
        opt.step()
    assert float((p.double() - ref.detach()).norm() / ref.detach().norm()) < 1e-6
    # the copy is the updated master rounded to nearest even, bit for bit
    assert torch.equal(copy, p.to(copy_dtype))


def test_bf16_copy_rounds_like_torch(simd_level, gen):
    """Ties, subnormals, infinities and NaN in the fused bf16/fp16 conversion."""
    special = torch.tensor(
        [
            1.0 + 2**-8,
            1.0 + 3 * 2**-8,
            -(1.0 + 2**-8),
            6e-41,
            -1e-45,
            65504.0,
            65520.0,
            1e-8,
            3.0e38,
            float("inf"),
            float("-inf"),
            float("nan"),
        ]
    )
    p = torch.cat([special, torch.randn(1000, generator=gen) * 1e4]).contiguous()
    n = p.numel()
    for dtype in (torch.bfloat16, torch.float16):
        copy = torch.empty(n, dtype=dtype)
        before = p.clone()
        # lr = 0: the param is unchanged, so the copy must equal before.to(dtype)
        F.sgd_step([p], [torch.zeros(n)], param_copies=[copy], first_step=True, lr=0.0)
        torch.testing.assert_close(copy, before.to(dtype), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_nonfinite_skip_leaves_everything_untouched(bad, simd_level, gen):
    params = [torch.randn(n, generator=gen) for n in (33, 5000, 7)]
    grads = [torch.randn(p.numel(), generator=gen).to(torch.bfloat16) for p in params]
    grads[1][4321] = bad
    ms = [torch.randn(p.numel(), generator=gen) for p in params]
    vs = [torch.rand(p.numel(), generator=gen) for p in params]
    snapshot = [t.clone() for t in params + ms + vs]
    found = F.adam_step(params, grads, ms, vs, step=3, lr=1e-3, nonfinite="skip")
    assert found is True
    for a, b in zip(params + ms + vs, snapshot):
        assert torch.equal(a, b)
    found = F.adam_step(params, grads, ms, vs, step=3, lr=1e-3, nonfinite="detect")
    assert found is True
    assert not torch.equal(params[0], snapshot[0])  # detect: the step ran


def test_nonfinite_ignored_when_not_asked(gen):
    p, g, m, v = make(100, gen, torch.float32)
    g[5] = float("nan")
    assert F.adam_step([p], [g], [m], [v], step=1, lr=1e-3) is False


def test_grad_stats_matches_torch(simd_level, gen):
    grads = [
        torch.randn(n, generator=gen).to(dt)
        for n, dt in ((1, torch.float32), (1 << 16, torch.float32), (999, torch.float32))
    ]
    sum_sq, bad = F.grad_stats(grads, scale=0.5)
    want = sum(float((g.double() * 0.5).pow(2).sum()) for g in grads)
    assert abs(sum_sq - want) <= 1e-6 * want and bad is False
    bf = [g.to(torch.bfloat16) for g in grads]
    sum_sq, _ = F.grad_stats(bf)
    want = sum(float(g.double().pow(2).sum()) for g in bf)
    assert abs(sum_sq - want) <= 1e-6 * want
    bf[2][10] = float("inf")
    assert F.grad_stats(bf)[1] is True


def test_clip_through_grad_scale(gen):
    """Global-norm clipping = one grad_stats pass + the coefficient folded into grad_scale."""
    params = [torch.randn(n, generator=gen) for n in (100, 300)]
    grads = [torch.randn(p.numel(), generator=gen) * 10 for p in params]
    refs = [torch.nn.Parameter(p.clone()) for p in params]
    for r, g in zip(refs, grads):
        r.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(refs, max_norm=1.0)
    torch.optim.SGD(refs, lr=0.1).step()
    sum_sq, _ = F.grad_stats(grads)
    coef = min(1.0, 1.0 / (sum_sq**0.5 + 1e-6))
    F.sgd_step(params, grads, first_step=True, lr=0.1, grad_scale=coef)
    for p, r in zip(params, refs):
        torch.testing.assert_close(p, r.detach(), rtol=1e-6, atol=1e-7)
