"""Sharded checkpoints across world sizes, and full safetensors checkpoints.

Resharding: train 8 steps at world 4 (stage 2, stage 3, and stage 1 saving the
layout-free full files), save; load at world 2 and 3 (each with a stage of its own)
and train on; every loss after the resume must match the uninterrupted
single-process torch run.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from megalith.testing import run_distributed, run_grid
from tests.zero import toy
from tests.zero.worker import Case, train

STEPS, SAVE_AT = 14, 8


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero_ckpt")
    cases = [
        Case(stage=2, steps=STEPS, save_after=SAVE_AT, save_dir=str(root / "s2"), max_norm=0.5),
        Case(stage=3, steps=STEPS, save_after=SAVE_AT, save_dir=str(root / "s3"), max_norm=0.5),
        Case(
            stage=1,
            steps=STEPS,
            save_after=SAVE_AT,
            save_dir=str(root / "f1"),
            max_norm=0.5,
            full=True,
        ),
    ]
    results = run_grid(train, cases, 4, timeout=240)
    return root, [r[0][0] for r in results]


@pytest.mark.parametrize("world_size", [2, 3])
def test_reshard_from_4(saved, world_size):
    root, full_losses = saved
    ref_losses, ref_params = toy.reference(0, STEPS, 1, 0.5)
    assert max(abs(a - b) for a, b in zip(full_losses[0], ref_losses)) < 1e-5
    cases = [
        Case(stage=3, steps=STEPS, resume=str(root / "s2"), first_step=SAVE_AT, max_norm=0.5),
        Case(stage=1, steps=STEPS, resume=str(root / "s3"), first_step=SAVE_AT, max_norm=0.5),
        Case(
            stage=2,
            steps=STEPS,
            resume=str(root / "f1"),
            first_step=SAVE_AT,
            max_norm=0.5,
            full=True,
        ),
    ]
    for case, per_rank in zip(cases, run_grid(train, cases, world_size, timeout=240)):
        losses, params = per_rank[0]
        assert len(losses) == STEPS - SAVE_AT
        for got, want in zip(losses, ref_losses[SAVE_AT:]):
            assert abs(got - want) < 1e-5 * abs(want), (
                f"{case}: loss {got} after resume, torch {want}"
            )
        for name, ref in ref_params.items():
            err = float((params[name] - ref).norm() / ref.norm())
            assert err < 1e-5, f"{case}: {name} off by {err:.3g}"


def save_full_then_read(rank: int, path: str):
    import megalith_comm as comm
    import megalith_zero as zero

    model = toy.make_model(3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    zmodel, zopt = zero.shard(
        model, opt, zero.ZeroConfig(stage=3, precision="bf16", chunk_bytes=1024)
    )
    x, y = toy.batches(3, 1, 1)[0][0]
    zopt.backward(toy.loss_fn(zmodel, x, y))
    zopt.step()
    zero.save_full(zmodel, path, max_shard_bytes=4096)
    expected = zmodel.full_state_dict()
    # Loading it back into a fresh model on every rank gives the same master values.
    model2 = toy.make_model(4)
    z2, o2 = zero.shard(
        model2,
        torch.optim.AdamW(model2.parameters(), lr=1e-2),
        zero.ZeroConfig(stage=2, chunk_bytes=2048),
    )
    zero.load_full(z2, o2, path)
    again = z2.full_state_dict()
    comm.barrier()
    return {
        k: bool(torch.equal(again[k], expected[k])) for k in expected
    }, expected if rank == 0 else None


def test_save_full_streams_safetensors(tmp_path):
    path = tmp_path / "full"
    results = run_distributed(save_full_then_read, 3, str(path), timeout=120)
    same, expected = results[0]
    assert all(same.values()), same
    index = json.loads((path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2, "max_shard_bytes=4096 should split the model over several files"
    loaded = {}
    for f in files:
        loaded.update(load_file(str(path / f)))
    for name, t in expected.items():
        assert torch.equal(loaded[name], t), name
    model = toy.make_model(0)
    missing, unexpected = model.load_state_dict(loaded, strict=False)
    assert not unexpected and set(missing) <= {"head.weight"}  # tied to embed.weight
