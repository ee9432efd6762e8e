"""The split backward's W pass is many autograd calls; what must still happen once:
megalith_zero reduces each gradient chunk once per step under ZB-V (not once per W call
of the rank's last W pass), and a checkpointed block runs its forward once in a
micro-batch's W (not once per W call). Results equal the plain runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import megalith_comm as comm
import megalith_zero as zero
from megalith.testing import run_distributed
from megalith_pipeline import Pipeline, as_layers
from megalith_pipeline.backward_split import input_pass
from tests.pipeline.checks import RTOL, _pairs, build, close, loss_fn


class _Counted(nn.Module):
    """A two-Linear MLP block run under torch.utils.checkpoint; counts its forward runs."""

    def __init__(self, dim: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.runs = 0

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return x + self.fc2(torch.tanh(self.fc1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._body, x, use_reentrant=False)


def test_checkpointed_block_recomputes_once_in_w():
    torch.manual_seed(0)
    blocks = nn.Sequential(*[_Counted(6) for _ in range(3)])
    x = torch.randn(5, 6)
    g = torch.randn(5, 6)
    leaf = x.clone().requires_grad_()
    torch.autograd.backward(blocks(leaf), g)
    want_x = leaf.grad.clone()
    want = {n: p.grad.clone() for n, p in blocks.named_parameters()}
    blocks.zero_grad(set_to_none=True)

    leaf = x.clone().requires_grad_()
    out = blocks(leaf)
    for b in blocks:
        b.runs = 0
    (got_x,), weight_pass = input_pass([out], [g], [leaf], list(blocks.parameters()))
    assert [b.runs for b in blocks] == [1, 1, 1]  # I: one recompute per block
    weight_pass.run()
    assert [b.runs for b in blocks] == [2, 2, 2], "W must recompute each block once"
    assert torch.equal(got_x, want_x)
    for n, p in blocks.named_parameters():
        assert torch.equal(p.grad, want[n]), n


def _zero_zbv(rank: int, steps: int) -> dict:
    torch.set_num_threads(1)
    mesh = comm.Mesh(None, pp=2, dp=1)
    ref, model = build("mlp", 8), build("mlp", 8)
    pipe = Pipeline(model, num_microbatches=4, schedule="zb-v", mesh=mesh, loss_fn=loss_fn("mlp"))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(pipe.module.parameters(), lr=1e-2)
    _, zopt = zero.shard(pipe.module, opt, zero.ZeroConfig(stage=1), mesh=mesh, axis="dp")
    reducer = zopt.reducer
    starts = [0] * len(reducer.units)

    def counting(k, start):
        def wrapped(group):
            starts[k] += 1
            return start(group)

        return wrapped

    for k, unit in enumerate(reducer.units):
        unit.start = counting(k, unit.start)
    pairs = _pairs(pipe, as_layers(ref))
    per_step, worst = [], 0.0
    for step in range(steps):
        g = torch.Generator().manual_seed(700 + step)
        x, y = torch.randn(9, 4, generator=g), torch.randn(9, 3, generator=g)
        loss_fn("mlp")(ref(x), y).backward()
        before, starts[:] = reducer.synced_backwards, [0] * len(starts)
        pipe.step(x, y, no_sync=zopt.no_sync)
        per_step.append((reducer.synced_backwards - before, list(starts)))
        zopt.step()
        zopt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        for _, p, q in pairs:
            worst = max(worst, close(p.detach(), q.detach()))
    return {"per_step": per_step, "worst": worst}


@pytest.mark.timeout(90)
def test_zero_reduces_each_chunk_once_per_step_under_zbv():
    for rank in run_distributed(_zero_zbv, 2, 2, timeout=80):
        for synced, starts in rank["per_step"]:
            assert synced == 1, rank["per_step"]
            assert starts and all(n == 1 for n in starts), rank["per_step"]
        assert rank["worst"] <= RTOL
