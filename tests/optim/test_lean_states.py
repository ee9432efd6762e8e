"""Lean Adam states (state_dtype="bf16" | "int8", bf16 Kahan masters) through the
Python path: one step against a numpy fp64 reference of the same rules
([Note: lean states] in core/include/megalith/optim/slots.h) with the same
rounding stream, stochastic rounding unbiased, checkpoints that keep the format
and convert between formats, bit-identical resume, and a small model whose loss
tracks fp32 states."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from megalith.optim import CPUAdam, HybridAdam
from megalith.optim import functional as F
from megalith_core.optim import lean_states
from tests.support.gpu import gpu

SIZES = (1000, 70_001, 257)  # mid-block and mid-vector ends; > 1 thread's share
LR, BETAS, EPS, WD, STEP, SEED = 1e-2, (0.9, 0.999), 1e-8, 0.1, 7, 1234
M64 = (1 << 64) - 1


# ------------------------------------------------------------ the reference


def _lowbias32(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def stream(seed: int, step: int, slot: int, n: int) -> np.ndarray:
    """The documented rounding stream (core/src/optim/rounding_stream.h), in numpy."""
    z = (seed + step * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    key = (z ^ (z >> 32)) & 0xFFFFFFFF
    base = int(_lowbias32(np.array([key ^ ((slot * 0x9E3779B9) & 0xFFFFFFFF)]))[0])
    return _lowbias32((np.arange(n, dtype=np.uint64) + base).astype(np.uint32))


def sr_bf16(x64: np.ndarray, r16: np.ndarray) -> np.ndarray:
    bits = x64.astype(np.float32).view(np.uint32).astype(np.uint64) + r16
    return ((bits >> 16) & 0xFFFF).astype(np.uint16)


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16)


def adam64(p, g, m, v, step=STEP):
    p = p * (1.0 - LR * WD)
    m = BETAS[0] * m + (1.0 - BETAS[0]) * g
    v = BETAS[1] * v + (1.0 - BETAS[1]) * g * g
    bc1, bc2 = 1.0 - BETAS[0] ** step, 1.0 - BETAS[1] ** step
    return p - LR / bc1 * m / (np.sqrt(v) / np.sqrt(bc2) + EPS), m, v


def assert_params(got: torch.Tensor, want: np.ndarray, before: np.ndarray) -> None:
    """fp32 accurate, relative to the value and to the size of this step's update."""
    update = np.abs(want - before * (1.0 - LR * WD))
    err = np.abs(got.double().numpy() - want)
    assert (err <= 2e-6 * np.maximum(1.0, np.abs(want)) + 1e-5 * update).all(), err.max()


def assert_codes(got: np.ndarray, position: np.ndarray) -> None:
    """Codes equal rint(position) but where fp32 and fp64 straddle a boundary (one in
    1e3 at most; a 257-element tensor may hold one or two)."""
    d = np.abs(got.astype(np.int64) - np.rint(position).astype(np.int64))
    assert d.max() <= 1
    assert d.sum() <= max(2, 1e-3 * d.size), (
        f"{d.sum()} of {d.size} codes differ from the fp64 rule"
    )


def step_kwargs(**kw):
    return dict(step=STEP, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, seed=SEED, **kw)


# ------------------------------------------------------------- one step


def test_bf16_states_match_fp64_reference(gen):
    ps = [torch.randn(n, generator=gen) for n in SIZES]
    gs = [torch.randn(n, generator=gen) for n in SIZES]
    ms = [(torch.randn(n, generator=gen) * 0.1).bfloat16() for n in SIZES]
    vs = [(torch.randn(n, generator=gen) * 0.1).square().bfloat16() for n in SIZES]
    before = [
        (p.double().numpy(), m.double().numpy(), v.double().numpy()) for p, m, v in zip(ps, ms, vs)
    ]
    F.adam_step(ps, gs, ms, vs, **step_kwargs())
    for k, (p0, m0, v0) in enumerate(before):
        p, m, v = adam64(p0, gs[k].double().numpy(), m0, v0)
        r = stream(SEED, STEP, k, SIZES[k]).astype(np.uint64)
        assert_params(ps[k], p, p0)
        g = gs[k].double().numpy()
        # where 0.9 m + 0.1 g cancels, fp32 and fp64 m differ by more than a bf16 step
        no_cancel = np.abs(m) >= 1e-2 * (0.9 * np.abs(m0) + 0.1 * np.abs(g))
        for got, want, where in (
            (ms[k], sr_bf16(m, r >> 16), no_cancel),
            (vs[k], sr_bf16(v, r & 0xFFFF), np.ones_like(no_cancel)),
        ):
            d = np.abs(bf16_bits(got).astype(np.int64) - want.astype(np.int64))
            assert d[where].max() <= 1
            assert (d != 0).sum() <= max(3, 1e-3 * d.size), "the same rounding stream"


def test_int8_states_match_fp64_reference(gen):
    ps = [torch.randn(n, generator=gen) for n in SIZES]
    gs = [torch.randn(n, generator=gen) for n in SIZES]
    cs = [torch.randint(-127, 128, (n,), generator=gen, dtype=torch.int8) for n in SIZES]
    qs = [torch.randint(0, 256, (n,), generator=gen).to(torch.uint8) for n in SIZES]
    blocks = [lean_states.blocks(n) for n in SIZES]
    a_s = [torch.rand(b, generator=gen) * 0.2 + 0.01 for b in blocks]
    u_s = [torch.rand(b, generator=gen) * 0.2 + 0.01 for b in blocks]
    before = [
        (
            p.double().numpy(),
            c.double().numpy(),
            q.double().numpy(),
            a.double().numpy(),
            u.double().numpy(),
        )
        for p, c, q, a, u in zip(ps, cs, qs, a_s, u_s)
    ]
    F.adam_step(ps, gs, cs, qs, exp_avg_scales=a_s, exp_avg_sq_scales=u_s, **step_kwargs())
    for k, (p0, c0, q0, a0, u0) in enumerate(before):
        n, bs = SIZES[k], lean_states.Q8_BLOCK
        block = np.arange(n) // bs
        m0 = c0 * np.abs(c0) * a0[block] / 127**2
        v0 = (q0 * q0 * u0[block] / 255**2) ** 2
        p, m, v = adam64(p0, gs[k].double().numpy(), m0, v0)
        assert_params(ps[k], p, p0)
        pad = blocks[k] * bs - n
        amax = np.abs(np.pad(m, (0, pad))).reshape(-1, bs).max(axis=1)
        umax = np.sqrt(np.pad(v, (0, pad)).reshape(-1, bs).max(axis=1))
        np.testing.assert_allclose(a_s[k].numpy(), amax, rtol=1e-5)
        np.testing.assert_allclose(u_s[k].numpy(), umax, rtol=1e-5)
        assert_codes(cs[k].numpy() * np.sign(m), 127 * np.sqrt(np.abs(m) / amax[block]))
        assert_codes(qs[k].numpy(), 255 * np.sqrt(np.sqrt(v) / umax[block]))


def test_bf16_kahan_masters_match_fp64_reference(gen):
    n = 50_021
    p32 = torch.randn(n, generator=gen)
    hi = p32.bfloat16()
    lo = (p32 - hi.float()).bfloat16()
    g = torch.randn(n, generator=gen)
    m = torch.randn(n, generator=gen) * 0.1
    v = (torch.randn(n, generator=gen) * 0.1).square()
    p0 = hi.double().numpy() + lo.double().numpy()
    want, _, _ = adam64(p0, g.double().numpy(), m.double().numpy(), v.double().numpy())
    F.adam_step([hi], [g], [m], [v], param_comps=[lo], **step_kwargs())
    got = hi.double().numpy() + lo.double().numpy()
    # hi + lo carries about 16 mantissa bits (2^-16 relative): 256x finer than a bf16 master
    err = np.abs(got - want)
    assert (err <= 2e-5 * np.maximum(np.abs(want), np.abs(p0)) + 1e-7).all(), err.max()


def test_stochastic_rounding_is_unbiased():
    # v = 0 and one gradient value: every element's new m is the same fp32 value
    # between two bf16 neighbours; the mean of the rounded values is unbiased.
    n = 1 << 16
    exact = np.float32(np.float32(1.0) - np.float32(0.9)) * np.float32(1.0 / 3.0)
    means = []
    for step in (1, 2):
        m = torch.zeros(n, dtype=torch.bfloat16)
        v = torch.zeros(n, dtype=torch.bfloat16)
        F.adam_step(
            [torch.ones(n)], [torch.full((n,), 1.0 / 3.0)], [m], [v], step=step, lr=1e-3, seed=5
        )
        vals = m.double().numpy()
        lo, hi = np.unique(vals)
        assert lo < exact < hi
        q = (exact - lo) / (hi - lo)
        se = (hi - lo) * np.sqrt(q * (1 - q) / n)
        assert abs(vals.mean() - exact) < 4 * se
        means.append(vals)
    assert not np.array_equal(means[0], means[1]), "each step draws new bits"


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_flat_binding_takes_lean_formats(state_dtype, gen):
    from megalith import _engine

    p, g = torch.randn(1000, generator=gen), torch.randn(1000, generator=gen)
    p2, flat, listed = p.clone(), lean_states.new_states(p, state_dtype), None
    listed = {k: t.clone() for k, t in flat.items()}
    q8 = state_dtype == "int8"
    for step in (1, 2):
        _engine.adam_step_flat(
            p,
            g,
            flat["exp_avg"],
            flat["exp_avg_sq"],
            hyper=_engine.AdamHyper(lr=LR),
            step=step,
            seed=SEED,
            exp_avg_scale=flat.get("exp_avg_scale"),
            exp_avg_sq_scale=flat.get("exp_avg_sq_scale"),
        )
        F.adam_step(
            [p2],
            [g],
            [listed["exp_avg"]],
            [listed["exp_avg_sq"]],
            exp_avg_scales=[listed["exp_avg_scale"]] if q8 else None,
            exp_avg_sq_scales=[listed["exp_avg_sq_scale"]] if q8 else None,
            step=step,
            lr=LR,
            seed=SEED,
        )
    assert torch.equal(p, p2)
    assert all(torch.equal(flat[k], listed[k]) for k in flat)


def test_wrong_buffers_are_named():
    p, g = torch.randn(300), torch.randn(300)
    c, q = torch.zeros(300, dtype=torch.int8), torch.zeros(300, dtype=torch.uint8)
    with pytest.raises(ValueError, match="exp_avg_scales"):
        F.adam_step([p], [g], [c], [q], step=1, lr=1e-3)
    with pytest.raises(ValueError, match="expected 2 for"):
        F.adam_step(
            [p],
            [g],
            [c],
            [q],
            exp_avg_scales=[torch.zeros(1)],
            exp_avg_sq_scales=[torch.zeros(2)],
            step=1,
            lr=1e-3,
        )
    with pytest.raises(ValueError, match="amsgrad"):
        CPUAdam([torch.nn.Parameter(p)], state_dtype="int8", amsgrad=True)
    with pytest.raises(ValueError, match="state_dtype='fp16'"):
        CPUAdam([torch.nn.Parameter(p)], state_dtype="fp16")


# --------------------------------------------------- optimizers, checkpoints


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 300), torch.nn.GELU(), torch.nn.Linear(300, 4))


def batches(gen, k):
    w = torch.randn(16, 4, generator=gen)
    out = []
    for _ in range(k):
        x = torch.randn(32, 16, generator=gen)
        out.append((x, torch.tanh(x @ w) + 0.05 * torch.randn(32, 4, generator=gen)))
    return out


def train(model, opt, data) -> list[float]:
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def reload(opt_cls, model, sd, **kw):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    opt = opt_cls(model.parameters(), **kw)
    opt.load_state_dict(torch.load(buf, weights_only=True))
    return opt


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_resume_is_bit_identical(state_dtype, gen):
    data = batches(gen, 8)
    whole, split = mlp(1), mlp(1)
    kw = dict(lr=1e-2, weight_decay=0.01, state_dtype=state_dtype, seed=3)
    train(whole, CPUAdam(whole.parameters(), **kw), data)
    first = CPUAdam(split.parameters(), **kw)
    train(split, first, data[:4])
    resumed = reload(CPUAdam, split, first.state_dict(), **kw)
    train(split, resumed, data[4:])
    for a, b in zip(whole.parameters(), split.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("source", lean_states.STATE_DTYPES)
@pytest.mark.parametrize("target", lean_states.STATE_DTYPES)
def test_checkpoints_keep_and_convert_formats(source, target, gen):
    data = batches(gen, 3)
    model = mlp(2)
    opt = CPUAdam(model.parameters(), lr=1e-2, state_dtype=source)
    train(model, opt, data)
    sd = opt.state_dict()
    assert all(g["state_dtype"] == source for g in sd["param_groups"])
    state0 = sd["state"][0]
    assert (
        state0["exp_avg"].dtype == lean_states.new_states(torch.zeros(1), source)["exp_avg"].dtype
    )
    assert ("exp_avg_scale" in state0) == (source == "int8")
    m_src, v_src = lean_states.to_fp32(opt.state[next(model.parameters())])

    loaded = reload(CPUAdam, model, sd, lr=1e-2, state_dtype=target)
    st = loaded.state[next(model.parameters())]
    assert lean_states.format_of(st) == target
    assert loaded.param_groups[0]["state_dtype"] == target
    m, v = lean_states.to_fp32(st)
    # within the coarser format's quantisation of the largest values
    coarse = "int8" in (source, target)
    tol = 2 / 127 if coarse else (2**-7 if "bf16" in (source, target) else 0)
    assert (m - m_src).abs().max() <= tol * m_src.abs().max() + 1e-12
    assert (v - v_src).abs().max() <= 2 * tol * v_src.abs().max() + 1e-12
    train(model, loaded, data)  # and it steps


def test_fp32_checkpoint_quantised_like_the_kernel(gen):
    m = torch.randn(5000, generator=gen) * 0.01
    v = (torch.randn(5000, generator=gen) * 0.01).square()
    q = lean_states.quantize(m, v)
    m2, v2 = lean_states.dequantize(q)
    again = lean_states.quantize(m2, v2)  # codes are a fixed point of decode/encode
    for name in ("exp_avg", "exp_avg_sq"):
        assert (again[name].int() - q[name].int()).abs().max() <= 1


def test_small_model_tracks_fp32_losses(gen):
    data = batches(gen, 200)
    finals, first = {}, {}
    for state_dtype in lean_states.STATE_DTYPES:
        model = mlp(4)
        opt = HybridAdam(model.parameters(), lr=3e-3, state_dtype=state_dtype)
        losses = train(model, opt, data)
        assert np.isfinite(losses).all()
        finals[state_dtype] = float(np.mean(losses[-20:]))
        first[state_dtype] = float(np.mean(losses[:5]))
    assert finals["fp32"] < 0.5 * first["fp32"], "the model learns"
    for state_dtype in ("bf16", "int8"):
        assert abs(finals[state_dtype] / finals["fp32"] - 1) < 0.02, finals


@pytest.mark.parametrize("name", ["CPUAdam", "HybridAdam", "FusedAdam"])
def test_colossalai_signatures_take_state_dtype(name, gen):
    import megalith.nn.optimizer as cai

    data = batches(gen, 3)
    model = mlp(5)
    opt = getattr(cai, name)(model.parameters(), lr=1e-2, state_dtype="int8")
    train(model, opt, data)
    assert lean_states.format_of(opt.state[next(model.parameters())]) == "int8"


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_rule_steps_lean_states_like_the_optimizer(state_dtype, gen):
    from megalith_core.optim.rules import rule_for

    p = torch.randn(3000, generator=gen)
    g = torch.randn(3000, generator=gen)
    ours = torch.nn.Parameter(p.clone())
    ours.grad = g.clone()
    opt = CPUAdam([ours], lr=1e-2, state_dtype=state_dtype, seed=9)
    opt.step()
    flat = p.clone()
    states = {k: [t] for k, t in lean_states.new_states(flat, state_dtype).items()}
    rule_for(opt).apply(opt.param_groups[0], 1, [flat], [g], states, None, 1.0)
    assert torch.equal(flat, ours.detach())
    for name, (t,) in states.items():
        assert torch.equal(t, opt.state[ours][name])


# ------------------------------------------------------------------- CUDA


def run_steps(params, grads, states, state_dtype, steps=3):
    q8 = state_dtype == "int8"
    for step in range(1, steps + 1):
        F.adam_step(
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            exp_avg_scales=[s["exp_avg_scale"] for s in states] if q8 else None,
            exp_avg_sq_scales=[s["exp_avg_sq_scale"] for s in states] if q8 else None,
            **{**step_kwargs(), "step": step},
        )


@gpu
@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_cuda_step_matches_host(state_dtype, gen):
    ps = [torch.randn(n, generator=gen) for n in SIZES]
    gs = [torch.randn(n, generator=gen) for n in SIZES]
    dev_p, dev_g = [p.cuda() for p in ps], [g.cuda() for g in gs]
    host = [lean_states.new_states(p, state_dtype) for p in ps]
    dev = [lean_states.new_states(p, state_dtype) for p in dev_p]
    run_steps(ps, gs, host, state_dtype)
    run_steps(dev_p, dev_g, dev, state_dtype)
    torch.cuda.synchronize()
    for p, d in zip(ps, dev_p):
        # The two kernels evaluate in fp32 in the same order but for the reciprocal (the
        # host's is within an ulp), so a moment that cancels to near zero can round to
        # another bf16 value and move a parameter by a fraction of a step: 1e-4 is a hundredth
        # of one (lr 1e-2); a wrong code or scale moves it by whole steps.
        torch.testing.assert_close(d.cpu(), p, rtol=1e-5, atol=1e-4)
    for h, d in zip(host, dev):
        m_h, v_h = lean_states.to_fp32(h)
        m_d, v_d = lean_states.to_fp32({k: t.cpu() for k, t in d.items()})
        assert (m_d - m_h).abs().max() <= 0.02 * m_h.abs().max()
        assert (v_d - v_h).abs().max() <= 0.04 * v_h.abs().max()
