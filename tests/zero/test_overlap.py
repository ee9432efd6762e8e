"""The step overlapped with its neighbours: ZeroConfig(step_in_backward=True) updates
chunks during backward, ZeroConfig(overlap_param_gather=True) leaves the parameter
all-gathers to the next forward's modules. Neither changes a number: 8 steps of the
toy model (tests/zero/toy.py: a tied head, a Linear called twice, one never called)
are bit-equal to the plain step, at worlds 2 and 3, and a checkpoint loaded while
gathers are pending resumes exactly."""

from __future__ import annotations

import pytest
import torch

import megalith_zero as zero
from megalith.testing import run_distributed, run_grid
from tests.offload.worker import Case, train
from tests.zero import toy

STEPS = 8  # bit-equal at every step; more steps add time, not checks
CASES = [
    Case(stage=1, overlap_gather=True, steps=STEPS),
    Case(stage=2, overlap_gather=True, steps=STEPS),
    Case(stage=1, eager=True, overlap_gather=True, steps=STEPS),
    Case(stage=2, eager=True, overlap_gather=True, steps=STEPS),
    Case(stage=2, tier="host", eager=True, overlap_gather=True, steps=STEPS),
    Case(stage=2, precision="bf16", overlap_gather=True, steps=STEPS),
]


def baseline(case: Case) -> Case:
    return Case(stage=case.stage, precision=case.precision, steps=STEPS)


@pytest.mark.parametrize("world_size", [2, 3])
def test_overlapped_steps_are_bit_equal(world_size):
    grid = CASES + sorted({baseline(c) for c in CASES}, key=str)
    results = dict(zip(grid, run_grid(train, grid, world_size, timeout=240)))
    for case in CASES:
        got, base = results[case][0], results[baseline(case)][0]
        assert not isinstance(got, tuple), f"{case}: {got}"
        assert got["losses"] == base["losses"], case
        for name, ref in base["params"].items():
            assert torch.equal(got["params"][name], ref), f"{case}: {name} differs"


def _resume(rank: int, path: str) -> dict:
    """Saves after 3 steps, takes 2 more, loads the save while the last step's gathers
    are still pending, and retakes the 2 steps: the losses must repeat."""
    model = toy.make_model(0)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    config = zero.ZeroConfig(stage=2, chunk_bytes=2048, overlap_param_gather=True)
    zmodel, zopt = zero.shard(model, opt, config)
    data = [micro[0] for micro in toy.batches(3, 5, 1)]
    for x, y in data[:3]:
        toy.zero_step(zmodel, zopt, x, y)
    zero.save_sharded(zmodel, zopt, path)
    first = [toy.zero_step(zmodel, zopt, x, y) for x, y in data[3:]]
    assert zmodel.deferred._pending, "the last step's gathers should still be pending"
    zero.load_sharded(zmodel, zopt, path)
    again = [toy.zero_step(zmodel, zopt, x, y) for x, y in data[3:]]
    return {"first": first, "again": again}


def test_checkpoint_load_waits_for_pending_gathers(tmp_path):
    for r in run_distributed(_resume, 2, str(tmp_path / "ck"), timeout=180):
        assert r["first"] == r["again"], r
