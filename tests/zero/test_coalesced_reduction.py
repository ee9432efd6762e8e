"""ZeroConfig(shard_each_param=True) with buckets: consecutive one-parameter chunks
reduce and gather as one collective ([Note: coalesced per-parameter shards] in
megalith_zero/buckets.py), and nothing changes a bit against one collective per
parameter (chunk_bytes=1: every bucket one parameter).

The toy model (tests/zero/toy.py: odd sizes, so every shard is uneven and padded; a
tied head, a Linear called twice, one never called) trains 3 steps at worlds 2 and 3,
stages 1 and 2, fp32 and bf16, with buckets of 600 bytes (several chunks each) and of the searched size, at most an
eighth of the model (chunk_bytes=0): the reduced gradient shards after each backward, the
losses and the final parameters are bit-equal to the per-parameter run. One case also
accumulates a micro-batch under no_sync and defers the gathers
(overlap_param_gather). The per-parameter fp32 run matches plain torch AdamW.
(At world 3 bit-equality holds for buffers this small; for large ones Gloo may sum a
rare element in another order: see the Note.)"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import megalith_comm as comm
import megalith_zero as zero
from megalith.testing import run_grid
from megalith_zero.layout import plan
from tests.zero import toy

STEPS = 3


@dataclass(frozen=True)
class Setting:
    stage: int
    precision: str
    chunk_bytes: int  # 1: one parameter per bucket (the reference)
    accumulate: int = 1
    overlap_gather: bool = False


def _train(rank: int, s: Setting) -> dict:
    model = toy.make_model(0)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    config = zero.ZeroConfig(
        stage=s.stage,
        precision=s.precision,
        chunk_bytes=s.chunk_bytes,
        shard_each_param=True,
        overlap_param_gather=s.overlap_gather,
    )
    zmodel, zopt = zero.shard(model, opt, config)
    group = zmodel.group
    rows = slice(rank * toy.BATCH // group.size, (rank + 1) * toy.BATCH // group.size)
    grads, losses = [], []
    for micro in toy.batches(0, STEPS, s.accumulate):
        for j, (x, y) in enumerate(micro):
            loss = toy.loss_fn(zmodel, x[rows], y[rows]) / s.accumulate
            if j < len(micro) - 1:
                with zopt.no_sync():
                    zopt.backward(loss)
            else:
                zopt.backward(loss)
        grads.append([c.shard_grad.clone() for c in zopt.trainable])
        if s.stage == 1:  # every rank's whole reduced gradient
            grads.append([c.full_grad.clone() for c in zopt.trainable])
        zopt.step()
        zopt.zero_grad()
        total = loss.detach().double()
        comm.all_reduce(total, op="avg", group=group)
        losses.append(float(total))
    zmodel.wait_params()
    return {
        "units": len(zopt.reducer.units),
        "grads": grads,
        "losses": losses,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "masters": [c.master.clone() for c in zopt.trainable],
    }


def _settings() -> tuple[list[Setting], dict[Setting, Setting]]:
    """The coalesced settings, each mapped to its per-parameter reference."""
    cases = [
        Setting(stage, precision, chunk_bytes)
        for stage in (1, 2)
        for precision in ("fp32", "bf16")
        for chunk_bytes in (600, 0)
    ]
    cases += [Setting(2, "fp32", 600, accumulate=2, overlap_gather=True)]
    refs = {c: Setting(c.stage, c.precision, 1, c.accumulate, c.overlap_gather) for c in cases}
    return cases, refs


@pytest.mark.parametrize("world_size", [2, 3])
def test_coalesced_reduction_is_bit_equal_to_per_parameter(world_size):
    cases, refs = _settings()
    grid = cases + sorted(set(refs.values()), key=str)
    results = dict(zip(grid, run_grid(_train, grid, world_size, timeout=240)))
    n_params = len(list(toy.make_model(0).parameters()))
    for case in cases:
        ref = refs[case]
        for rank in range(world_size):
            got, want = results[case][rank], results[ref][rank]
            assert want["units"] == n_params, ref  # one collective per parameter
            assert got["units"] < want["units"], case
            assert got["losses"] == want["losses"], (case, rank)
            for step, (g, w) in enumerate(zip(got["grads"], want["grads"])):
                for k, (a, b) in enumerate(zip(g, w)):
                    assert torch.equal(a, b), f"{case} rank {rank}: grads {step}, chunk {k}"
            for a, b in zip(got["masters"], want["masters"]):
                assert torch.equal(a, b), f"{case} rank {rank}: a master differs"
            for name, p in want["params"].items():
                assert torch.equal(got["params"][name], p), f"{case} rank {rank}: {name}"
    # the searched bucket size, at most an eighth of the model: a few collectives
    assert 1 < results[Setting(2, "fp32", 0)][0]["units"] <= 8 + 2, "buckets of an eighth"
    # and the per-parameter fp32 run is torch's AdamW on the whole batch
    _, ref_params = toy.reference(0, STEPS, 1, None)
    got = results[Setting(1, "fp32", 1)][0]["params"]
    for name, p in ref_params.items():
        torch.testing.assert_close(got[name], p, rtol=1e-5, atol=1e-6, msg=name)


def test_buckets_follow_colossalai_filling():
    """A chunk that would overflow the open bucket closes it; a larger one is alone;
    frozen chunks are in none; bucket_numel=0 gives every chunk its own."""
    sizes = [10, 20, 40, 100, 5, 5]
    params = [(f"p{i}", torch.empty(n), 0) for i, n in enumerate(sizes)]
    params[4] = ("frozen", torch.empty(5), -1)
    layout = plan(params, 2, 1024, shard_each_param=True, bucket_numel=96)
    # padded to 2 * 16 elements: 32, 32, 64, 128, (frozen 32), 32
    assert [c.numel for c in layout.chunks] == [32, 32, 64, 128, 32, 32]
    assert [c.bucket for c in layout.chunks] == [0, 0, 1, 2, -1, 3]
    per_param = plan(params, 2, 1024, shard_each_param=True, bucket_numel=0)
    assert [c.bucket for c in per_param.chunks] == [0, 1, 2, 3, -1, 4]
    packed = plan(params, 2, 1024)
    assert all(c.bucket == -1 for c in packed.chunks)
