"""Model-state bytes per rank, read from the engine's accounting, against ZeRO's formulas.

bf16 working parameters, fp32 masters, AdamW (two fp32 states), N ranks, P = the
parameters' elements as laid out in chunks (each chunk padded to whole aligned
shards; P is checked to be within 3% of the model's own count here).
"""

from __future__ import annotations

import pytest

from megalith.testing import run_grid
from tests.zero.budget import model_state_bytes


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_model_state_bytes_match_zero_formulas(world_size):
    n = world_size
    for stage, per_rank in zip((1, 2, 3), run_grid(model_state_bytes, [1, 2, 3], n, timeout=240)):
        for report, chunk_numels, real in per_rank:
            p = sum(chunk_numels)
            assert real <= p <= 1.03 * real, (p, real)
            cur = {k: v[0] for k, v in report.items()}
            peak = {k: v[1] for k, v in report.items()}
            assert cur["master"] == 4 * p // n  # fp32 master shard
            assert cur["optim_states"] == 8 * p // n  # exp_avg + exp_avg_sq, fp32 shards
            assert cur["grads_in_flight"] == 0  # transient gradient chunks all returned
            if stage == 1:
                assert cur["params"] == 2 * p  # every rank keeps the full bf16 params
                assert cur["grads"] == 2 * p  # ... and full bf16 grads (all-reduced)
                total = 4 * p + 12 * p // n
            elif stage == 2:
                assert cur["params"] == 2 * p  # full bf16 params
                assert cur["grads"] == 2 * p // n  # bf16 grad shard, reduce-scattered
                total = 2 * p + 14 * p // n
            else:
                assert cur["params"] == 2 * p // n  # bf16 param shard
                assert cur["grads"] == 2 * p // n  # bf16 grad shard
                assert cur["gathered"] == 0  # nothing gathered between steps
                total = 16 * p // n
                # In flight: the running module's chunks, the one idle until the next
                # module starts, and the prefetched one: at most 3 chunks of bf16.
                assert 0 < peak["gathered"] <= 3 * 2 * max(chunk_numels), peak["gathered"]
            persistent = sum(cur[k] for k in ("params", "master", "optim_states", "grads"))
            assert persistent == total, (stage, persistent, total)
            if stage > 1:  # full-size gradient chunks exist only while being reduced
                assert 0 < peak["grads_in_flight"] < 2 * p


def train_then_drop(rank: int, stage: int) -> list[bool]:
    """Trains a step, drops the model and optimizer, and says which chunks are still alive."""
    import gc
    import weakref

    import torch

    import megalith_zero as zero
    from tests.zero import toy

    model = toy.make_model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    zmodel, zopt = zero.shard(model, opt, zero.ZeroConfig(stage=stage, chunk_bytes=2048))
    for micro in toy.batches(rank, 1, 1):
        zopt.backward(toy.loss_fn(zmodel, *micro[0]))
    zopt.step()
    chunks = [weakref.ref(c) for c in zopt.chunks]
    assert chunks, "the toy model has chunks"
    del model, opt, zmodel, zopt, micro
    gc.collect()
    return [c() is not None for c in chunks]


def test_dropped_model_returns_its_chunk_memory():
    # Parameters hold the gradient hooks; a hook that held its reducer strongly kept
    # every chunk (and its device memory) alive after the model was gone.
    for stage, per_rank in zip((1, 2, 3), run_grid(train_then_drop, [1, 2, 3], 2, timeout=120)):
        for alive in per_rank:
            assert not any(alive), f"stage {stage}: {sum(alive)} chunks outlived their model"
