"""CUDA kernels through megalith.optim (skipped without a GPU): the same
tolerances as the CPU tests, multi-tensor over ~300 tensors of mixed sizes,
inf/nan detection, the fused unscale + norm pass, sync-free skips and streams."""

from __future__ import annotations

import pytest
import torch

from megalith.optim import FusedAdam, FusedLion, FusedSGD, HybridAdam
from megalith.optim import functional as F
from tests.optim.test_reference import RefLion, assert_fp32_accurate
from tests.support.gpu import gpu

pytestmark = gpu


def gpt_like_shapes(d=64, layers=24, vocab=1000):
    shapes = [(vocab, d), (128, d)]
    for _ in range(layers):
        shapes += [
            (d,),
            (d,),
            (3 * d, d),
            (3 * d,),
            (d, d),
            (d,),
            (d,),
            (d,),
            (4 * d, d),
            (4 * d,),
            (d, 4 * d),
            (d,),
        ]
    return [*shapes, (d,), (d,)]


def run_lists(make_ours, make_ref, shapes, steps, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    p0 = [torch.randn(s, generator=gen, device="cuda") for s in shapes]
    ours = [torch.nn.Parameter(t.clone()) for t in p0]
    r32 = [torch.nn.Parameter(t.clone()) for t in p0]
    r64 = [torch.nn.Parameter(t.double()) for t in p0]
    opts = [make_ours(ours), make_ref(r32), make_ref(r64)]
    for _ in range(steps):
        for i, s in enumerate(shapes):
            g = torch.randn(s, generator=gen, device="cuda") * 0.1
            ours[i].grad, r32[i].grad, r64[i].grad = g.clone(), g.clone(), g.double()
        for o in opts:
            o.step()

    def flat(ps):
        return torch.cat([p.detach().reshape(-1) for p in ps])

    return flat(ours), flat(r32), flat(r64)


@pytest.mark.parametrize("amsgrad,adamw", [(False, True), (True, False)])
def test_fused_adam_multi_tensor_matches_torch(amsgrad, adamw):
    shapes = gpt_like_shapes()
    assert len(shapes) > 290
    torch_cls = torch.optim.AdamW if adamw else torch.optim.Adam
    ours, r32, r64 = run_lists(
        lambda ps: FusedAdam(ps, lr=1e-3, weight_decay=0.01, amsgrad=amsgrad, adamw_mode=adamw),
        lambda ps: torch_cls(ps, lr=1e-3, weight_decay=0.01, amsgrad=amsgrad, foreach=False),
        shapes,
        100,
        seed=int(torch.randint(0, 2**31, (1,))),
    )
    assert_fp32_accurate(ours, r32, r64)


def test_more_tensors_than_one_launch_holds():
    shapes = [(int(n),) for n in torch.randint(1, 5000, (700,))]
    ours, r32, r64 = run_lists(
        lambda ps: FusedAdam(ps, lr=1e-3),
        lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.0, foreach=False),
        shapes,
        10,
        seed=1,
    )
    assert_fp32_accurate(ours, r32, r64)


@pytest.mark.parametrize("n", [1, 7, 1023, (1 << 20) + 3])
def test_sgd_and_lion_flat(n):
    seed = int(torch.randint(0, 2**31, (1,)))
    kw = dict(momentum=0.9, nesterov=True, weight_decay=0.01)
    assert_fp32_accurate(
        *run_lists(
            lambda ps: FusedSGD(ps, lr=1e-2, **kw),
            lambda ps: torch.optim.SGD(ps, lr=1e-2, foreach=False, **kw),
            [(n,)],
            100,
            seed,
        )
    )
    assert_fp32_accurate(
        *run_lists(
            lambda ps: FusedLion(ps, lr=1e-4, weight_decay=0.1),
            lambda ps: RefLion(ps, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1),
            [(n,)],
            100,
            seed,
        ),
        fixed_size_steps=100,
    )


def test_hybrid_adam_steps_cpu_and_gpu_params_together():
    a = torch.nn.Parameter(torch.randn(1000))
    b = torch.nn.Parameter(torch.randn(1000, device="cuda"))
    ra, rb = torch.nn.Parameter(a.detach().clone()), torch.nn.Parameter(b.detach().clone())
    ours, ref = HybridAdam([a, b], lr=1e-2), torch.optim.AdamW([ra, rb], lr=1e-2, weight_decay=0.0)
    for _ in range(5):
        for x, y in ((a, ra), (b, rb)):
            g = torch.randn_like(x)
            x.grad, y.grad = g, g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a, ra, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(b, rb, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("copy_dtype", [torch.bfloat16, torch.float16])
def test_mixed_precision_grads_and_param_copy(grad_dtype, copy_dtype):
    sizes = [3, 4096, 100_003, 17]
    ps = [torch.randn(n, device="cuda") for n in sizes]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    copies = [torch.empty(n, device="cuda", dtype=copy_dtype) for n in sizes]
    refs = [torch.nn.Parameter(p.double()) for p in ps]
    opt = torch.optim.AdamW(refs, lr=1e-3, weight_decay=0.01, foreach=False)
    for step in range(1, 6):
        gs = [(torch.randn(n, device="cuda") * 0.01).to(grad_dtype) for n in sizes]
        F.adam_step(ps, gs, ms, vs, param_copies=copies, step=step, lr=1e-3, weight_decay=0.01)
        for r, g in zip(refs, gs):
            r.grad = g.double()
        opt.step()
    for p, r, c in zip(ps, refs, copies):
        assert float((p.double() - r.detach()).norm() / r.detach().norm()) < 1e-6
        assert torch.equal(c, p.to(copy_dtype))


def test_grad_check_flags_and_norm():
    grads = [torch.randn(n, device="cuda").to(torch.bfloat16) for n in (5, 70_001, 1 << 20)]
    found, sum_sq = torch.zeros(1, device="cuda"), torch.zeros(1, device="cuda")
    inv = torch.tensor([0.25], device="cuda")
    F.grad_check(grads, found, sum_sq, inv_scale=inv)
    want = sum(float((g.double() * 0.25).pow(2).sum()) for g in grads)
    assert found.item() == 0.0
    assert abs(sum_sq.item() - want) < 1e-5 * want
    for bad in (float("inf"), float("nan")):
        found.zero_()
        g2 = [g.clone() for g in grads]
        g2[1][1234] = bad
        F.grad_check(g2, found)
        assert found.item() == 1.0
    # in place: the grads become grad * inv_scale
    before = grads[1].clone()
    F.grad_check(grads, found.zero_(), inv_scale=inv, unscale_in_place=True)
    torch.testing.assert_close(grads[1], (before.float() * 0.25).to(torch.bfloat16), rtol=0, atol=0)


def test_device_scalars_skip_unscale_and_clip():
    n = 10_000
    p = torch.randn(n, device="cuda")
    g = torch.randn(n, device="cuda") * 100
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    found = torch.ones(1, device="cuda")
    snapshot = p.clone()
    F.adam_step(
        [p], [g], [m], [v], step=1, lr=1e-3, device_scalars=F.DeviceScalars(found_inf=found)
    )
    assert torch.equal(p, snapshot) and m.abs().sum().item() == 0  # skipped, no host sync needed
    # unscale by 1/100 and clip to norm 1 on the device; reference: torch
    found.zero_()
    sum_sq = torch.zeros(1, device="cuda")
    inv = torch.tensor([0.01], device="cuda")
    F.grad_check([g], found, sum_sq, inv_scale=inv)
    ref = torch.nn.Parameter(p.clone())
    ref.grad = g * 0.01
    torch.nn.utils.clip_grad_norm_([ref], 1.0)
    torch.optim.SGD([ref], lr=0.1).step()
    F.sgd_step(
        [p],
        [g],
        first_step=True,
        lr=0.1,
        device_scalars=F.DeviceScalars(
            inv_scale=inv, found_inf=found, grad_sum_sq=sum_sq, max_grad_norm=1.0
        ),
    )
    torch.testing.assert_close(p, ref.detach(), rtol=1e-5, atol=1e-6)


def test_runs_in_order_on_a_side_stream():
    side = torch.cuda.Stream()
    p = torch.randn(1 << 22, device="cuda")
    opt = FusedAdam([torch.nn.Parameter(p.clone())], lr=1e-1)
    param = opt.param_groups[0]["params"][0]
    with torch.cuda.stream(side):
        param.grad = torch.ones_like(param)  # produced on the side stream
        opt.step()  # must be ordered after the fill on the same stream
        out = param.detach().clone()
    side.synchronize()
    torch.testing.assert_close(out, p - 0.1, rtol=1e-5, atol=1e-5)
