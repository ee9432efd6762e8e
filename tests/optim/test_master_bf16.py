"""master_dtype="bf16" on the Adam optimizers: bf16 parameters stepped as their own
masters with a bf16 Kahan compensation (state 'param_comp'), against an fp64
reference of the rule and against fp32 masters; checkpoints keep the compensation;
fp32 parameters refused. And the default (master_dtype unset) leaves param groups,
states and steps as they were before master_dtype existed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megalith.optim import CPUAdam
from tests.optim.test_lean_states import BETAS, EPS, WD, batches, mlp, reload, train

NAMES = ["CPUAdam", "HybridAdam", "FusedAdam"]


# ------------------------------------------------------------ the default path


@pytest.mark.parametrize("name", NAMES)
def test_default_masters_leave_groups_and_states_as_before(name, gen):
    import megalith.nn.optimizer as cai

    cls = getattr(cai, name)
    data = batches(gen, 3)
    runs = []
    for kw in ({}, {"master_dtype": "fp32"}):
        for dtype in (torch.float32, torch.bfloat16):
            model = mlp(4).to(dtype)
            opt = cls(model.parameters(), lr=1e-2, weight_decay=0.01, **kw)
            train_in(model, opt, data, dtype)
            sd = opt.state_dict()
            assert all("master_dtype" not in g for g in sd["param_groups"]), sd["param_groups"]
            for st, p in zip(sd["state"].values(), model.parameters()):
                assert set(st) == {"step", "exp_avg", "exp_avg_sq"}
                # the fp32-shadow rule keeps a half parameter's states in its dtype
                assert st["exp_avg"].dtype == st["exp_avg_sq"].dtype == p.dtype
            runs.append([p.detach().clone() for p in model.parameters()])
    # unset and explicit "fp32" take the same steps, bit for bit, in both dtypes
    for a, b in zip(runs[0] + runs[1], runs[2] + runs[3]):
        assert torch.equal(a, b)


def test_default_checkpoint_moves_to_torch_adamw_and_back(gen):
    data = batches(gen, 4)
    ours, theirs = mlp(5), mlp(5)
    opt = CPUAdam(ours.parameters(), lr=1e-2, weight_decay=0.01)
    train(ours, opt, data[:2])
    theirs.load_state_dict(ours.state_dict())
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.01)
    ref.load_state_dict(opt.state_dict())
    back = reload(CPUAdam, ours, ref.state_dict(), lr=1e-2, weight_decay=0.01)
    assert all("master_dtype" not in g for g in back.param_groups)
    assert all("param_comp" not in s for s in back.state.values())
    a, b = train(ours, back, data[2:]), train(theirs, ref, data[2:])
    assert np.allclose(a, b, rtol=1e-5, atol=0), (a, b)


def train_in(model, opt, data, dtype) -> None:
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(dtype)), y.to(dtype)).backward()
        opt.step()


# ------------------------------------------------ bf16 Kahan masters (master_dtype)


def bf16_round(x64: np.ndarray) -> np.ndarray:
    """Round to nearest even bf16, as float64 (through fp32, as the kernel computes)."""
    return torch.from_numpy(x64.astype(np.float32)).bfloat16().double().numpy()


def test_bf16_master_tracks_fp32_master_over_50_steps(gen):
    import megalith.nn.optimizer as cai

    n, steps, lr = 4096, 50, 1e-3
    p0 = torch.randn(n, generator=gen).bfloat16()
    grads = [torch.randn(n, generator=gen).bfloat16() for _ in range(steps)]
    kw = dict(lr=lr, betas=BETAS, eps=EPS, weight_decay=WD)
    runs = {}
    for name, dtype, master in (
        ("fp32", torch.float32, "fp32"),
        ("kahan", torch.bfloat16, "bf16"),
        ("plain", torch.bfloat16, "fp32"),
    ):
        p = torch.nn.Parameter(p0.to(dtype, copy=True))
        opt = cai.CPUAdam([p], master_dtype=master, **kw)
        for g in grads:
            p.grad = g.to(dtype, copy=True)
            opt.step()
        comp = opt.state[p].get("param_comp")
        assert (comp is not None) == (master == "bf16")
        runs[name] = p.detach().double().numpy() + (0 if comp is None else comp.double().numpy())
        if name != "plain":  # the shadow rule keeps states in the parameter's dtype
            assert opt.state[p]["exp_avg"].dtype == torch.float32
    # the Kahan rule in fp64: the update on hi + lo, then hi = bf16(p), lo = bf16(p - hi)
    hi, lo = p0.double().numpy(), np.zeros(n)
    m, v = np.zeros(n), np.zeros(n)
    for k, g in enumerate(grads, start=1):
        g64 = g.double().numpy()
        p = hi + lo
        p = p * (1.0 - lr * WD)
        m = BETAS[0] * m + (1 - BETAS[0]) * g64
        v = BETAS[1] * v + (1 - BETAS[1]) * g64 * g64
        bc1, bc2 = 1 - BETAS[0] ** k, 1 - BETAS[1] ** k
        p = p - lr / bc1 * m / (np.sqrt(v) / np.sqrt(bc2) + EPS)
        hi = bf16_round(p)
        lo = bf16_round(p - hi)
    scale = np.abs(runs["fp32"]).max()
    err_rule = np.abs(runs["kahan"] - (hi + lo)).max() / scale
    err_kahan = np.abs(runs["kahan"] - runs["fp32"]).max() / scale
    err_plain = np.abs(runs["plain"] - runs["fp32"]).max() / scale
    # measured: rule ~1.5e-5, kahan ~4e-5, plain bf16 ~9e-3 of max |p|
    assert err_rule <= 1e-4, err_rule
    assert err_kahan <= 1.5e-4, err_kahan
    assert err_kahan * 20 < err_plain, (err_kahan, err_plain)


def train_bf16(model, opt, data) -> None:
    train_in(model, opt, data, torch.bfloat16)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_master_resume_is_bit_identical(name, gen):
    import megalith.nn.optimizer as cai

    cls = getattr(cai, name)
    data = batches(gen, 6)
    whole, split = mlp(1).bfloat16(), mlp(1).bfloat16()
    kw = dict(lr=1e-2, weight_decay=0.01, master_dtype="bf16", state_dtype="bf16")
    train_bf16(whole, cls(whole.parameters(), **kw), data)
    first = cls(split.parameters(), **kw)
    train_bf16(split, first, data[:3])
    sd = first.state_dict()
    assert sd["param_groups"][0]["master_dtype"] == "bf16"
    assert sd["state"][0]["param_comp"].dtype == torch.bfloat16
    assert sd["state"][0]["param_comp"].abs().sum() > 0
    resumed = reload(cls, split, sd, **kw)
    train_bf16(split, resumed, data[3:])
    for a, b in zip(whole.parameters(), split.parameters()):
        assert torch.equal(a, b)


def test_bf16_master_checkpoint_without_comp_starts_at_zero(gen):
    model = mlp(2).bfloat16()
    data = batches(gen, 2)
    # an fp32-master checkpoint of the same layout: fp32 states, no param_comp
    sd = CPUAdam([torch.nn.Parameter(p.detach().float()) for p in model.parameters()]).state_dict()
    sd["state"] = {
        i: {
            "step": torch.tensor(3.0),
            "exp_avg": torch.randn(p.shape, generator=gen) * 0.01,
            "exp_avg_sq": torch.rand(p.shape, generator=gen) * 1e-4,
        }
        for i, p in enumerate(model.parameters())
    }
    kw = dict(lr=1e-2, master_dtype="bf16")
    loaded = reload(CPUAdam, model, sd, **kw)
    assert loaded.param_groups[0]["master_dtype"] == "bf16"
    for i, p in enumerate(model.parameters()):
        st = loaded.state[p]
        assert torch.equal(st["param_comp"], torch.zeros_like(p))
        assert torch.equal(st["exp_avg"], sd["state"][i]["exp_avg"])  # fp32 kept, not bf16-cast
    train_bf16(model, loaded, data)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_master_refuses_fp32_params(name, gen):
    import megalith.nn.optimizer as cai

    p = torch.nn.Parameter(torch.randn(8, generator=gen))
    with pytest.raises(TypeError, match=r"Pass bf16 parameters.*master_dtype='fp32'"):
        getattr(cai, name)([p], master_dtype="bf16")
    with pytest.raises(ValueError, match="master_dtype='fp8'"):
        CPUAdam([p], master_dtype="fp8")
