"""Booster checkpoints of a tensor-parallel model are layout-free: save_model writes the
full (unsharded) tensors and load_model puts each rank's shard back; save_optimizer
writes every parameter's full optimizer state (gathered over tp, and over dp under
ZeRO), which loads at tp 2, at tp 1 (a plain torch AdamW) and trains on as before."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from megalith import models
from megalith.testing import run_distributed
from tests.tensor_parallel.checkpoint import (
    CASE,
    optimizer_round_trip,
    save_and_load,
    zero_bf16_load_survives_a_step,
)
from tests.tensor_parallel.models import build


def test_tp_model_checkpoint_is_full(tmp_path):
    path = str(tmp_path / "model")
    same, _ = run_distributed(save_and_load, 2, path, timeout=120)
    assert all(same.values()), [n for n, ok in same.items() if not ok]
    ref = models.create("llama-tiny", device="cpu", seed=3)
    files = sorted((tmp_path / "model").glob("*.safetensors"))
    shapes = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
    for n, p in ref.named_parameters():
        assert shapes[n] == tuple(p.shape), n


def test_tp_zero_bf16_load_reaches_the_masters(tmp_path):
    changed = run_distributed(zero_bf16_load_survives_a_step, 2, str(tmp_path), timeout=180)
    assert changed == [[], []], changed[0][:5]


@pytest.mark.parametrize(
    ("world", "zero_stage"),
    [(2, 0), (4, 1)],  # tp 2; tp 2 x dp 2 with ZeRO-1's optimizer shards
)
def test_tp_optimizer_checkpoint_round_trips(tmp_path, gen, world, zero_stage):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    per_rank = run_distributed(
        optimizer_round_trip, world, str(tmp_path), zero_stage, seed, timeout=180
    )
    failures = [f"rank {r}: {e}" for r, errs in enumerate(per_rank) for e in errs[:4]]
    assert not failures, "\n".join(failures)
    meta = json.loads((tmp_path / "optim" / "optimizer.json").read_text())
    shapes = {}
    for f in (tmp_path / "optim").glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
    for n, p in build(CASE).named_parameters():  # full shapes, one entry per parameter name
        assert meta["params"][n] == {"group": 0, "step": 2}, n
        for state in ("exp_avg", "exp_avg_sq"):
            assert shapes[f"{n}::{state}"] == tuple(p.shape), (n, state)
