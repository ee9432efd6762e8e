"""The automatic split of backward into input-gradient (I) and weight-gradient (W) passes:
I then W gives what one backward gives, I leaves .grad alone, W fires the gradient hooks,
and nothing on the input path runs twice."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from megalith_pipeline.backward_split import input_pass
from megalith_pipeline.tree import flatten, unflatten
from tests.pipeline import models


def _leaves(obj):
    tensors, spec = flatten(obj)
    leaves = [t.detach().requires_grad_(t.is_floating_point() and t.requires_grad) for t in tensors]
    return unflatten(spec, leaves), [t for t in leaves if t.requires_grad]


def _compare(layers: nn.Module, x, seed: int = 0) -> None:
    """One backward vs I then W, from the same input (whose grad-requiring tensors are leaves)."""
    x, leaves = _leaves(x)
    out = [t for t in flatten(layers(x))[0] if t.requires_grad]
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(t.shape, generator=g) for t in out]
    torch.autograd.backward(out, grads)
    want_x = [t.grad.clone() for t in leaves]
    want_w = {n: p.grad.clone() for n, p in layers.named_parameters()}
    layers.zero_grad(set_to_none=True)

    x, leaves = _leaves(x)
    out = [t for t in flatten(layers(x))[0] if t.requires_grad]
    got_x, weight_pass = input_pass(out, grads, leaves, list(layers.parameters()))
    assert all(p.grad is None for p in layers.parameters()), "I must not touch .grad"
    weight_pass.run()
    for a, b in zip(got_x, want_x):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    for n, p in layers.named_parameters():
        torch.testing.assert_close(p.grad, want_w[n], rtol=1e-6, atol=1e-7, msg=n)


def test_split_equals_backward_on_several_models():
    torch.manual_seed(0)
    _compare(
        nn.Sequential(*list(models.mlp(6))[1:5]), torch.randn(5, models.DIM, requires_grad=True)
    )
    mixed = models.mixed(9)
    first = mixed[0](torch.randn(4, 4))  # a dict with a mask and ids that need no grad
    _compare(nn.Sequential(*list(mixed)[1:]), first)
    gpt = models.tiny_gpt2(2)
    blocks = nn.Sequential(*[mod for mod in list(gpt.transformer.h)])
    blocks = nn.Sequential(*[_First(b) for b in blocks], gpt.transformer.ln_f, gpt.lm_head)
    _compare(blocks, torch.randn(2, 8, 16, requires_grad=True))


class _First(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x)[0]


class _Shared(nn.Module):
    """One weight used twice, directly: the split falls back to a whole backward for W."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.tanh(x @ self.w) @ self.w + self.b * 2


class _WeightOnlyOutput(nn.Module):
    """A second output that depends on the weights alone."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x), self.lin.weight.sum(0, keepdim=True) * 3


def test_shared_weights_and_weight_only_outputs():
    torch.manual_seed(1)
    _compare(_Shared(), torch.randn(3, 4, requires_grad=True))
    _compare(_WeightOnlyOutput(), torch.randn(3, 4, requires_grad=True))


def test_first_stage_w_is_the_whole_backward_and_hooks_fire():
    torch.manual_seed(2)
    layers = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    fired = []
    for p in layers.parameters():
        p.register_post_accumulate_grad_hook(lambda p: fired.append(p))
    out = layers(torch.randn(3, 4))  # no input needs grad: I is empty
    got_x, weight_pass = input_pass([out], [torch.ones_like(out)], [], list(layers.parameters()))
    assert got_x == [] and not fired
    weight_pass.run()
    assert len(fired) == 4 and all(p.grad is not None for p in layers.parameters())


def test_the_input_path_runs_once():
    """Count how often each layer's backward runs: the I pass once, the W pass never."""
    calls = {"input": 0}

    class Count(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            calls["input"] += 1
            return g

    torch.manual_seed(3)
    lins = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
    x = torch.randn(2, 4, requires_grad=True)
    h = x
    for lin in lins:
        h = lin(Count.apply(torch.tanh(h)))
    _, weight_pass = input_pass([h], [torch.ones_like(h)], [x], list(lins.parameters()))
    assert calls["input"] == 3
    weight_pass.run()
    assert calls["input"] == 3
    assert all(p.grad is not None for p in lins.parameters())


@pytest.mark.parametrize("unused", [True, False])
def test_input_without_a_path_gets_zeros(unused):
    lin = nn.Linear(4, 4)
    a, b = torch.randn(2, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True)
    out = lin(a) if unused else lin(a + b)
    got, weight_pass = input_pass([out], [torch.ones_like(out)], [a, b], list(lin.parameters()))
    assert torch.count_nonzero(got[1]).item() == (0 if unused else 8)
    weight_pass.run()
