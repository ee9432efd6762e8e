"""megalith.nn.optimizer: ColossalAI's optimizer names and signatures.

Each optimizer takes 20 steps on fresh random gradients and is compared with torch's
own optimizer where one exists, otherwise with a reference written here from the
paper's update rule (as ColossalAI documents it), on the same data, in fp32.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

import megalith.nn.optimizer as O

STEPS = 20
SHAPES = [(6, 5), (5,), (4, 7)]


def _params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _grads(step: int, scale: float = 1.0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return [scale * torch.randn(s, generator=g) for s in SHAPES]


def _run(make, steps: int = STEPS, scale: float = 1.0, params=None) -> list[torch.Tensor]:
    ps = [torch.nn.Parameter(p.clone()) for p in (params or _params())]
    opt = make(ps)
    for k in range(steps):
        for p, g in zip(ps, _grads(k, scale)):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in ps]


def _run_reference(step_fn, steps: int = STEPS, scale: float = 1.0) -> list[torch.Tensor]:
    ps = [p.clone() for p in _params()]
    states = [{} for _ in ps]
    for k in range(steps):
        grads = _grads(k, scale)
        before = [p.clone() for p in ps]
        ps = step_fn(k + 1, before, grads, states)
    return ps


def _close(a: list[torch.Tensor], b: list[torch.Tensor], rtol=2e-5, atol=2e-6) -> None:
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


def _rms(t: torch.Tensor) -> torch.Tensor:
    return t.pow(2).mean().sqrt()


# --- the engine optimizers, against torch -----------------------------------------


@pytest.mark.parametrize("cls", [O.HybridAdam, O.CPUAdam, O.FusedAdam])
@pytest.mark.parametrize("adamw_mode", [True, False])
def test_adam_family_matches_torch(cls, adamw_mode):
    # ColossalAI's positional order: params, lr, bias_correction, betas, eps, weight_decay, ...
    if cls is O.FusedAdam:
        make = lambda ps: cls(ps, 1e-2, True, (0.9, 0.99), 1e-8, adamw_mode, 0.05)  # noqa: E731
    else:
        make = lambda ps: cls(ps, 1e-2, True, (0.9, 0.99), 1e-8, 0.05, adamw_mode)  # noqa: E731
    torch_cls = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    ref = _run(lambda ps: torch_cls(ps, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05))
    _close(_run(make), ref)


def test_hybrid_adam_keywords_of_colossalai_scripts():
    ref = _run(lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1))
    got = _run(
        lambda ps: O.HybridAdam(
            model_params=ps, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, adamw_mode=True
        )
    )
    _close(got, ref)
    # **defaults: amsgrad is honoured, unknown keywords warn once
    ref = _run(lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.0, amsgrad=True))
    _close(_run(lambda ps: O.HybridAdam(ps, lr=1e-2, amsgrad=True)), ref)
    with pytest.warns(UserWarning, match="simd_log is ignored"):
        O.HybridAdam(_params(), simd_log=True)


def test_adam_without_bias_correction():
    def ref(t, ps, gs, st):
        out = []
        for p, g, s in zip(ps, gs, st):
            s["m"] = 0.9 * s.get("m", 0) + 0.1 * g
            s["v"] = 0.999 * s.get("v", 0) + 0.001 * g * g
            out.append(p * (1 - 1e-2 * 0.01) - 1e-2 * s["m"] / (s["v"].sqrt() + 1e-8))
        return out

    got = _run(lambda ps: O.FusedAdam(ps, lr=1e-2, bias_correction=False, weight_decay=0.01))
    _close(got, _run_reference(ref), atol=1e-5)  # 20 steps of the engine's fused arithmetic


def test_nvme_offload_fraction_is_ignored_with_a_warning():
    with pytest.warns(UserWarning, match="nvme_offload_fraction"):
        opt = O.HybridAdam(_params(), nvme_offload_fraction=0.5, nvme_offload_dir="/tmp")
    assert isinstance(opt, torch.optim.Optimizer)


def test_fused_adam_set_grad_none_and_retired_arguments():
    ps = [torch.nn.Parameter(p) for p in _params()]
    opt = O.FusedAdam(ps, set_grad_none=False)
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in ps)
    with pytest.raises(ValueError, match="retired"):
        opt.step(grads=[p.grad for p in ps])


def test_fused_sgd_matches_torch():
    kw = dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=1e-3, nesterov=True)
    _close(_run(lambda ps: O.FusedSGD(ps, **kw)), _run(lambda ps: torch.optim.SGD(ps, **kw)))
    with pytest.raises(NotImplementedError, match="wd_after_momentum=False"):
        O.FusedSGD(_params(), lr=0.1, wd_after_momentum=True)
    with pytest.raises(TypeError):
        O.FusedSGD(_params())  # lr is required, as in ColossalAI


# --- LAMB ------------------------------------------------------------------------


def _lamb_ref(lr, b1, b2, eps, wd, bias_correction, adam=False):
    def step(t, ps, gs, st):
        out = []
        for p, g, s in zip(ps, gs, st):
            s["m"] = b1 * s.get("m", 0) + (1 - b1) * g
            s["v"] = b2 * s.get("v", 0) + (1 - b2) * g * g
            rate = lr * math.sqrt(1 - b2**t) / (1 - b1**t) if bias_correction else lr
            r = s["m"] / (s["v"].sqrt() + eps) + wd * p
            wn, rn = p.norm(), r.norm()
            trust = 1.0 if adam or wn == 0 or rn == 0 else float(wn / rn)
            out.append(p - rate * trust * r)
        return out

    return step


@pytest.mark.parametrize(
    "kw",
    [
        dict(lr=1e-2, weight_decay=0.01),
        dict(lr=1e-2, betas=(0.8, 0.9), weight_decay=0.1, bias_correction=True),
        dict(lr=1e-2, adam=True),
    ],
)
def test_lamb(kw):
    full = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, bias_correction=False)
    full.update({k: v for k, v in kw.items() if k != "adam"})
    ref = _lamb_ref(full["lr"], *full["betas"], full["eps"], full["weight_decay"],
                    full["bias_correction"], kw.get("adam", False))  # fmt: skip
    _close(_run(lambda ps: O.Lamb(ps, **kw)), _run_reference(ref))


def _fused_lamb_ref(lr, wd, max_norm, adam_w_mode=True, grad_averaging=True, nvlamb=False):
    b1, b2, eps = 0.9, 0.999, 1e-6

    def step(t, ps, gs, st):
        total = math.sqrt(sum(float(g.pow(2).sum()) for g in gs))
        div = max(1.0, total / max_norm)
        out = []
        for p, g, s in zip(ps, gs, st):
            g = g / div
            if not adam_w_mode:
                g = g + wd * p
            s["m"] = b1 * s.get("m", 0) + ((1 - b1) if grad_averaging else 1.0) * g
            s["v"] = b2 * s.get("v", 0) + (1 - b2) * g * g
            u = (s["m"] / (1 - b1**t)) / ((s["v"] / (1 - b2**t)).sqrt() + eps)
            if adam_w_mode:
                u = u + wd * p
            ratio = 1.0
            if wd != 0 or nvlamb:
                wn, un = p.norm(), u.norm()
                ratio = float(wn / un) if wn > 0 and un > 0 else 1.0
            out.append(p - lr * ratio * u)
        return out

    return step


def test_fused_lamb_default_clips_the_global_norm():
    got = _run(lambda ps: O.FusedLAMB(ps, lr=1e-2), scale=3.0)  # norm ~ 30 > max_grad_norm 1
    _close(got, _run_reference(_fused_lamb_ref(1e-2, 0.01, 1.0), scale=3.0))


def test_fused_lamb_l2_mode_no_averaging_nvlamb():
    make = lambda ps: O.FusedLAMB(  # noqa: E731
        ps, lr=1e-2, weight_decay=0.0, adam_w_mode=False, grad_averaging=False,
        max_grad_norm=100.0, use_nvlamb=True,
    )  # fmt: skip
    ref = _fused_lamb_ref(1e-2, 0.0, 100.0, adam_w_mode=False, grad_averaging=False, nvlamb=True)
    _close(_run(make), _run_reference(ref))
    ref = _fused_lamb_ref(1e-2, 0.05, 1e9, adam_w_mode=False)
    _close(_run(lambda ps: O.FusedLAMB(ps, lr=1e-2, weight_decay=0.05, adam_w_mode=False,
                                       max_grad_norm=1e9)), _run_reference(ref))  # fmt: skip
    with pytest.raises(NotImplementedError, match="amsgrad=False"):
        O.FusedLAMB(_params(), amsgrad=True)


# --- LARS ------------------------------------------------------------------------


def test_lars():
    lr, mom, eeta, wd, eps = 0.1, 0.9, 1e-2, 1e-3, 1e-8

    def ref(t, ps, gs, st):
        out = []
        for p, g, s in zip(ps, gs, st):
            wn, gn = p.norm(), g.norm()
            trust = eeta * wn / (gn + wd * wn + eps) if wn > 0 and gn > 0 else torch.tensor(1.0)
            trust = float(trust.clamp(0, 50))
            d = (g + wd * p).clamp(-10, 10)
            s["b"] = d.clone() if "b" not in s else mom * s["b"] + d
            out.append(p - lr * trust * s["b"])
        return out

    make = lambda ps: O.Lars(ps, lr=lr, momentum=mom, eeta=eeta, weight_decay=wd, epsilon=eps)  # noqa: E731
    _close(_run(make, scale=4.0), _run_reference(ref, scale=4.0))


# --- Adafactor, CAME ----------------------------------------------------------------


def _second_moment(s, key, sq, beta):
    """Adafactor's estimate V of E[G^2] (factored for matrices), from the paper."""
    if sq.dim() >= 2:
        s[key + "R"] = beta * s.get(key + "R", 0) + (1 - beta) * sq.mean(dim=-1)
        s[key + "C"] = beta * s.get(key + "C", 0) + (1 - beta) * sq.mean(dim=-2)
        return torch.outer(s[key + "R"], s[key + "C"]) / s[key + "R"].mean()
    s[key] = beta * s.get(key, 0) + (1 - beta) * sq
    return s[key]


def _adafactor_ref(
    lr=None, beta1=None, wd=0.0, relative=True, scale=True, warmup=False, project=None
):
    e1, e2, d = 1e-30, 1e-3, 1.0

    def step(t, ps, gs, st):
        out = []
        for p, g, s in zip(ps, gs, st):
            back = None
            if project is not None and g.dim() == 2:
                g, back = project(t, g, s)
            rho = min(1e-6 * t if warmup else 1e-2, 1 / math.sqrt(t)) if relative else lr
            alpha = max(e2, float(_rms(p))) * rho if scale else rho
            beta2 = 1 - t**-0.8
            u = g / _second_moment(s, "v", g * g + e1, beta2).sqrt()
            u = alpha * u / max(1.0, float(_rms(u)) / d)
            if beta1 is not None:
                s["m"] = beta1 * s.get("m", 0) + (1 - beta1) * u
                u = s["m"]
            if back is not None:
                u = back(u)
            out.append(p - wd * alpha * p - u)
        return out

    return step


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(beta1=0.9, weight_decay=0.01), dict(lr=1e-2, relative_step=False, scale_parameter=False),
     dict(warmup_init=True)],
)  # fmt: skip
def test_adafactor(kw):
    ref = _adafactor_ref(kw.get("lr"), kw.get("beta1"), kw.get("weight_decay", 0.0),
                         kw.get("relative_step", True), kw.get("scale_parameter", True),
                         kw.get("warmup_init", False))  # fmt: skip
    _close(_run(lambda ps: O.Adafactor(ps, **kw)), _run_reference(ref), rtol=5e-5, atol=5e-6)
    _close(
        _run(lambda ps: O.DistributedAdaFactor(ps, **kw)), _run(lambda ps: O.Adafactor(ps, **kw))
    )


def test_adafactor_manual_lr_with_relative_step_warns():
    with pytest.warns(UserWarning, match="relative_step=False"):
        O.Adafactor(_params(), lr=1e-3)
    with pytest.raises(ValueError, match="needs lr"):
        O.Adafactor(_params(), relative_step=False)


def test_came():
    lr, (b1, b2, b3), (e1, e2), wd = 1e-2, (0.9, 0.999, 0.9999), (1e-30, 1e-16), 0.01

    def ref(t, ps, gs, st):
        out = []
        for p, g, s in zip(ps, gs, st):
            u = g / _second_moment(s, "v", g * g + e1, b2).sqrt()
            u = u / max(1.0, float(_rms(u)))
            s["m"] = b1 * s.get("m", 0) + (1 - b1) * u
            if g.dim() >= 2:
                conf = _second_moment(s, "r", (u - s["m"]) ** 2 + e2, b3)
                upd = s["m"] / conf.sqrt()
            else:
                upd = s["m"]
            out.append(p - wd * lr * p - lr * upd)
        return out

    make = lambda ps: O.CAME(ps, lr=lr, weight_decay=wd)  # noqa: E731
    _close(_run(make), _run_reference(ref), rtol=5e-5, atol=5e-6)
    _close(_run(lambda ps: O.DistributedCAME(ps, lr=lr, weight_decay=wd)), _run(make))
    with pytest.raises(ValueError, match="lr"):
        O.CAME(_params())


# --- GaLore ---------------------------------------------------------------------


def _galore_projector(rank, gap, scale):
    def project(t, g, s):
        if (t - 1) % gap == 0:
            u, _, vh = torch.linalg.svd(g, full_matrices=False)
            s["P"] = vh[:rank] if g.shape[0] >= g.shape[1] else u[:, :rank]
        P = s["P"]
        if g.shape[0] >= g.shape[1]:
            return g @ P.T, lambda low: scale * (low @ P)
        return P.T @ g, lambda low: scale * (P @ low)

    return project


def _galore_groups(ps):
    return [
        {"params": [ps[0], ps[2]], "rank": 2, "update_proj_gap": 7, "scale": 0.5},
        {"params": [ps[1]]},
    ]


def test_galore_adamw():
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-6, 0.01
    project = _galore_projector(2, 7, 0.5)

    def ref(t, ps, gs, st):
        out = []
        for p, g, s in zip(ps, gs, st):
            back = None
            if g.dim() == 2:
                g, back = project(t, g, s)
            s["m"] = b1 * s.get("m", 0) + (1 - b1) * g
            s["v"] = b2 * s.get("v", 0) + (1 - b2) * g * g
            n = s["m"] / (s["v"].sqrt() + eps)
            if back is not None:
                n = back(n)
            p = p - lr * math.sqrt(1 - b2**t) / (1 - b1**t) * n
            out.append(p * (1 - lr * wd))
        return out

    make = lambda ps: O.GaLoreAdamW(_galore_groups(ps), lr=lr, weight_decay=wd)  # noqa: E731
    _close(_run(make), _run_reference(ref), rtol=5e-5, atol=5e-6)


def test_galore_adafactor():
    ref = _adafactor_ref(beta1=0.9, project=_galore_projector(2, 7, 0.5))
    make = lambda ps: O.GaLoreAdafactor(_galore_groups(ps), beta1=0.9)  # noqa: E731
    _close(_run(make), _run_reference(ref), rtol=5e-5, atol=5e-6)


def test_galore_param_groups_and_8bit_refusal():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    groups = O.get_galore_param_groups(model, weight_decay=0.1, rank=2)
    assert [len(g["params"]) for g in groups] == [2, 0, 2] and groups[0]["rank"] == 2
    for cls in (O.GaLoreAdamW8bit, O.DistGaloreAwamW):
        try:
            import bitsandbytes  # noqa: F401

            expected, match = NotImplementedError, "GaLoreAdamW"
        except ImportError:
            expected, match = ImportError, "pip install bitsandbytes"
        with pytest.raises(expected, match=match):
            cls(groups)


# --- Distributed*, cast_to_distributed, tensor-parallel shards ------------------------


class _Group:
    """A stand-in for a process group of `size` ranks (megalith_comm's groups carry .size)."""

    def __init__(self, size: int) -> None:
        self.size = size


def test_distributed_lamb_is_lamb_for_whole_parameters():
    def make(ps):
        opt = O.DistributedLamb(ps, lr=1e-2, weight_decay=0.01)
        opt.setup_distributed(tp_group=None, dp_group=_Group(2), is_zero=False)
        return opt

    _close(
        _run(make), _run(lambda ps: O.Lamb(ps, lr=1e-2, weight_decay=0.01, bias_correction=True))
    )


def test_distributed_refuses_shards():
    ps = [torch.nn.Parameter(p) for p in _params()]
    with pytest.raises(NotImplementedError, match="use_zero=False"):
        O.DistributedAdaFactor(ps).setup_distributed(dp_group=_Group(2))
    O.DistributedAdaFactor(ps).setup_distributed(dp_group=_Group(2), use_zero=False)
    with pytest.raises(NotImplementedError, match="Lamb without ZeRO"):
        flat = {id(ps[0]): torch.zeros(60)}
        O.DistributedLamb(ps).setup_distributed(shard_to_working_param=flat)
    ps[0].tp_spec = object()  # what megalith's tensor-parallel layers put on a shard
    with pytest.raises(NotImplementedError, match="tp_size=1"):
        O.DistributedCAME(ps, lr=1e-3).setup_distributed(tp_group=_Group(2))
    for p, g in zip(ps, _grads(0)):
        p.grad = g
    for opt in (O.Lamb(ps), O.DistributedLamb(ps), O.Adafactor(ps), O.Lars(ps)):
        with pytest.raises(NotImplementedError, match="tensor-parallel shard"):
            opt.step()


def test_cast_to_distributed_keeps_groups_and_state():
    ps = [torch.nn.Parameter(p) for p in _params()]
    lamb = O.Lamb(ps, lr=1e-2, weight_decay=0.01)
    for p, g in zip(ps, _grads(0)):
        p.grad = g
    lamb.step()
    dist = O.cast_to_distributed(lamb)
    assert type(dist) is O.DistributedLamb
    assert dist.param_groups[0]["lr"] == 1e-2 and dist.param_groups[0]["bias_correction"] is False
    assert dist.state[ps[0]] is lamb.state[ps[0]]
    adam = O.HybridAdam(ps)
    assert O.cast_to_distributed(adam) is adam


# --- state_dict round trip, defaults quiet ------------------------------------------

ROUND_TRIP = [
    lambda ps: O.HybridAdam(ps, lr=1e-2),
    lambda ps: O.Lamb(ps, lr=1e-2, weight_decay=0.01),
    lambda ps: O.FusedLAMB(ps, lr=1e-2),
    lambda ps: O.Lars(ps, lr=0.1, momentum=0.9),
    lambda ps: O.Adafactor(ps, beta1=0.9),
    lambda ps: O.CAME(ps, lr=1e-2),
    lambda ps: O.GaLoreAdamW(_galore_groups(ps), lr=1e-2),
]


@pytest.mark.parametrize("make", ROUND_TRIP)
def test_state_dict_round_trip(make):
    expected = _run(make)
    ps = [torch.nn.Parameter(p.clone()) for p in _params()]
    opt = make(ps)
    for k in range(STEPS):
        if k == STEPS // 2:
            sd = opt.state_dict()
            opt = make(ps)
            opt.load_state_dict(sd)
        for p, g in zip(ps, _grads(k)):
            p.grad = g.clone()
        opt.step()
    _close([p.detach() for p in ps], expected, rtol=0, atol=0)


def test_defaults_construct_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for cls in (O.HybridAdam, O.CPUAdam, O.FusedAdam, O.Lamb, O.FusedLAMB, O.Lars,
                    O.Adafactor, O.DistributedLamb, O.DistributedAdaFactor):  # fmt: skip
            cls(_params())
        O.FusedSGD(_params(), lr=0.1)
        O.CAME(_params(), lr=1e-3)
        O.GaLoreAdamW(_galore_groups(_params()))
    assert json.dumps(sorted(O.__all__))
