"""megalith.nn.lr_scheduler: ColossalAI's schedulers by name and arguments.

Each scheduler's learning rates, read after construction and after each step, are
compared with the closed form ColossalAI's docs give (or torch's own scheduler where
ColossalAI wraps one); state_dict survives JSON (megalith's checkpoint format) and a
new scheduler continues the sequence; schedulers drive a boosted optimizer.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

import megalith.nn.lr_scheduler as S
from megalith.booster.wrappers import OptimizerWrapper

BASES = (0.1, 0.04)
N = 14  # steps past total_steps = 10 too


def _optimizer(momentum: float = 0.9) -> torch.optim.Optimizer:
    a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2))
    return torch.optim.SGD(
        [{"params": [a], "lr": BASES[0]}, {"params": [b], "lr": BASES[1]}], momentum=momentum
    )


def _flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def _sequence(scheduler, optimizer, steps: int = N) -> list[list[float]]:
    out = [[g["lr"] for g in optimizer.param_groups]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        out.append([g["lr"] for g in optimizer.param_groups])
    return out


def _cos(b, eta, t, period):
    return eta + (b - eta) * (1 + math.cos(math.pi * t / period)) / 2


def _warm(k, w, b, after):
    return (k + 1) / w * b if k < w else after


# name -> (constructor kwargs, closed form lr(k, base))
CLOSED_FORMS = {
    "CosineAnnealingLR": (dict(total_steps=10, eta_min=0.01), lambda k, b: _cos(b, 0.01, k, 10)),
    "CosineAnnealingWarmupLR": (
        dict(total_steps=10, warmup_steps=3, eta_min=0.005),
        lambda k, b: _warm(k, 3, b, _cos(b, 0.005, k - 3, 7)),
    ),
    "FlatAnnealingLR": (
        dict(total_steps=10, pct_start=0.5),
        lambda k, b: b if k < 5 else _cos(b, 0.0, k - 5, 5),
    ),
    "FlatAnnealingWarmupLR": (
        dict(total_steps=10, warmup_steps=2, pct_start=0.5, eta_min=0.001),
        lambda k, b: _warm(k, 2, b, b if k < 6 else _cos(b, 0.001, k - 6, 4)),
    ),
    "LinearWarmupLR": (
        dict(total_steps=10, warmup_steps=3),
        lambda k, b: (k + 1) / 4 * b if k < 3 else max(0.0, (10 - k) / 7) * b,
    ),
    "MultiStepLR": (
        dict(total_steps=10, milestones=[3, 7], gamma=0.5),
        lambda k, b: b * 0.5 ** ((k >= 3) + (k >= 7)),
    ),
    "MultiStepWarmupLR": (
        dict(total_steps=10, warmup_steps=2, milestones=[1, 4, 8], gamma=0.5),
        lambda k, b: _warm(k, 2, b, b * 0.5 ** ((k >= 4) + (k >= 8))),
    ),
    "PolynomialLR": (
        dict(total_steps=10, end_lr=0.001, power=2.0),
        lambda k, b: (b - 0.001) * (1 - min(k, 10) / 10) ** 2 + 0.001,
    ),
    "PolynomialWarmupLR": (
        dict(total_steps=10, warmup_steps=4, end_lr=0.002, power=0.5),
        lambda k, b: _warm(k, 4, b, (b - 0.002) * (1 - min(k - 4, 6) / 6) ** 0.5 + 0.002),
    ),
    "LambdaLR": (dict(total_steps=10, lr_lambda=lambda k: 1 / (k + 1)), lambda k, b: b / (k + 1)),
    "MultiplicativeLR": (
        dict(total_steps=10, lr_lambda=lambda k: 0.9),
        lambda k, b: b * 0.9**k,
    ),
    "StepLR": (dict(total_steps=10, step_size=3, gamma=0.3), lambda k, b: b * 0.3 ** (k // 3)),
    "ExponentialLR": (dict(total_steps=10, gamma=0.8), lambda k, b: b * 0.8**k),
}


def test_every_colossalai_name_is_here():
    expected = {*CLOSED_FORMS, "OneCycleLR"}
    assert set(S.__all__) == expected
    from megalith.nn import CosineAnnealingWarmupLR

    assert CosineAnnealingWarmupLR is S.CosineAnnealingWarmupLR


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_closed_form(name):
    kwargs, formula = CLOSED_FORMS[name]
    opt = _optimizer()
    got = _sequence(getattr(S, name)(opt, **kwargs), opt)
    for k, lrs in enumerate(got):
        for lr, b in zip(lrs, BASES):
            assert lr == pytest.approx(formula(k, b), rel=1e-9, abs=1e-12), (k, lrs)


@pytest.mark.parametrize("three_phase", [False, True])
def test_one_cycle_is_torch_one_cycle_on_the_groups_lr(three_phase):
    kw = dict(pct_start=0.4, anneal_strategy="linear", div_factor=10.0, final_div_factor=100.0)
    opt = _optimizer()
    got = _sequence(S.OneCycleLR(opt, 12, three_phase=three_phase, **kw), opt, 11)
    ref_opt = _optimizer()
    ref = torch.optim.lr_scheduler.OneCycleLR(
        ref_opt, list(BASES), total_steps=12, three_phase=three_phase, **kw
    )
    assert _flat(got) == pytest.approx(_flat(_sequence(ref, ref_opt, 11)))
    assert opt.param_groups[0]["momentum"] == ref_opt.param_groups[0]["momentum"]


def _all_schedulers():
    yield from ((n, kw) for n, (kw, _) in CLOSED_FORMS.items())
    yield "OneCycleLR", dict(total_steps=20)


@pytest.mark.parametrize("name,kwargs", list(_all_schedulers()))
def test_state_dict_round_trip(name, kwargs):
    cls = getattr(S, name)
    opt = _optimizer()
    sched = cls(opt, **kwargs)
    _sequence(sched, opt, 4)
    state = json.loads(json.dumps(sched.state_dict()))  # what save_lr_scheduler writes
    new_opt = _optimizer()
    new = cls(new_opt, **kwargs)
    for g, h in zip(new_opt.param_groups, opt.param_groups):  # what loading the optimizer does
        g.update({k: h[k] for k in ("lr", "initial_lr", "momentum") if k in h})
    new.load_state_dict(state)
    assert new.state_dict() == json.loads(json.dumps(sched.state_dict()))
    expected = _flat(_sequence(sched, opt, 8))
    assert _flat(_sequence(new, new_opt, 8)) == pytest.approx(expected)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step()`")
def test_colossalai_save_load_pattern():
    # ColossalAI's own test: two schedulers on one optimizer, state copied each step
    opt = _optimizer()
    a = S.CosineAnnealingWarmupLR(opt, total_steps=5, warmup_steps=2)
    b = S.CosineAnnealingWarmupLR(opt, total_steps=5, warmup_steps=2)
    for _ in range(5):
        a.step()
        b.load_state_dict(a.state_dict())
        assert a.state_dict() == b.state_dict()


class _ZeroLike:
    """Like megalith_zero's ZeroOptimizer: not a torch optimizer; it shows the user's
    optimizer's param_groups and never calls its step() (it marks it as stepped)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self) -> None:
        self.optimizer._opt_called = True


@pytest.mark.parametrize("nested", [False, True])
def test_schedulers_drive_a_boosted_optimizer(nested):
    opt = _optimizer()
    boosted = OptimizerWrapper(_ZeroLike(opt) if nested else opt)
    kwargs, formula = CLOSED_FORMS["CosineAnnealingWarmupLR"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()"
        sched = S.CosineAnnealingWarmupLR(boosted, **kwargs)
        got = _sequence(sched, boosted)
        one_cycle = S.OneCycleLR(OptimizerWrapper(_optimizer()), total_steps=5)
        step = S.StepLR(boosted, 10, step_size=2)
    assert sched.optimizer is opt and one_cycle.optimizer is not None and step.optimizer is opt
    for k, lrs in enumerate(got):
        assert lrs[1] == pytest.approx(formula(k, BASES[1]))
    with pytest.raises(TypeError, match="build the scheduler on the torch optimizer"):
        S.LinearWarmupLR(type("Fake", (), {"param_groups": []})(), total_steps=3)


def test_arguments():
    opt = _optimizer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # defaults are quiet
        S.CosineAnnealingWarmupLR(opt, total_steps=10)
        S.FlatAnnealingWarmupLR(opt, total_steps=10)
        S.OneCycleLR(opt, total_steps=10)
    with pytest.warns(UserWarning, match="eta_min is ignored"):
        S.FlatAnnealingLR(_optimizer(), total_steps=10, eta_min=0.1)
    with pytest.raises(ValueError, match="milestones"):
        S.MultiStepWarmupLR(_optimizer(), total_steps=10, warmup_steps=2)
    with pytest.raises(ValueError, match="warmup_steps"):
        S.CosineAnnealingWarmupLR(_optimizer(), total_steps=4, warmup_steps=4)
    with pytest.raises(ValueError, match="pct_start"):
        S.FlatAnnealingLR(_optimizer(), total_steps=10, pct_start=1.5)
    with pytest.raises(ValueError, match="lr_lambda"):
        S.LambdaLR(_optimizer(), 10)
