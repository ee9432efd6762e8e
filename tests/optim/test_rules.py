"""megalith_core.optim.rules: one registry of what megalith knows per optimizer class."""

from __future__ import annotations

import pytest
import torch

from megalith_core.optim import (
    CPUSGD,
    CPUAdam,
    CPULion,
    HybridAdam,
    Rule,
    register_rule,
    rule_for,
)


def params(gen: torch.Generator, n: int = 3) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.randn(5, generator=gen)) for _ in range(n)]


@pytest.mark.parametrize(
    ("make", "kind", "decoupled"),
    [
        (lambda p: torch.optim.AdamW(p), "adam", True),
        (lambda p: torch.optim.Adam(p), "adam", False),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "sgd", False),
        (lambda p: HybridAdam(p), "adam", True),
        (lambda p: HybridAdam(p, adamw_mode=False), "adam", False),
        (lambda p: CPUAdam(p), "adam", True),
        (lambda p: CPUSGD(p, lr=0.1), "sgd", False),
        (lambda p: CPULion(p), "lion", False),
    ],
)
def test_rule_of_each_supported_class(gen, make, kind, decoupled):
    rule = rule_for(make(params(gen)))
    assert (rule.kind, rule.decoupled_default) == (kind, decoupled)
    assert "lr" in rule.hyperparameters and "maximize" in rule.hyperparameters


def test_state_names_follow_the_group():
    adam, sgd = Rule("adam"), Rule("sgd")
    assert adam.state_names({"amsgrad": False}) == ("exp_avg", "exp_avg_sq")
    assert adam.state_names({"amsgrad": True})[-1] == "max_exp_avg_sq"
    assert sgd.state_names({"momentum": 0.0}) == ()
    assert sgd.state_names({"momentum": 0.9}) == ("momentum_buffer",)
    assert Rule("lion").state_names({}) == ("exp_avg",)


def test_a_subclass_takes_its_parents_rule(gen):
    class MyAdamW(torch.optim.AdamW):
        pass

    assert rule_for(MyAdamW(params(gen))) == Rule("adam", decoupled_default=True)


def test_unknown_optimizer_names_the_fix(gen):
    with pytest.raises(ValueError, match="register_rule"):
        rule_for(torch.optim.RMSprop(params(gen)))


def test_a_registered_class_steps_like_its_rule(gen):
    class Momentum(torch.optim.SGD):  # registered by itself, not through its parent
        pass

    register_rule(Momentum, lambda opt: Rule("sgd"))
    ps = params(gen)
    opt = Momentum(ps, lr=0.05, momentum=0.9)
    rule = rule_for(opt)
    group = opt.param_groups[0]
    flat = [p.detach().clone() for p in ps]
    grads = [torch.randn(5, generator=gen) for _ in ps]
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    opt.step()  # torch's SGD: the reference
    states = {"momentum_buffer": [torch.zeros(5) for _ in ps]}
    rule.apply(group, 1, flat, grads, states, None, 1.0)
    for mine, ref in zip(flat, ps):
        torch.testing.assert_close(mine, ref.detach(), rtol=1e-6, atol=1e-7)


def test_register_rule_refuses_a_non_optimizer():
    with pytest.raises(TypeError, match=r"not a torch\.optim\.Optimizer"):
        register_rule(dict, Rule("sgd"))
    with pytest.raises(ValueError, match="kind='rmsprop'"):
        Rule("rmsprop")
