"""Asynchronous ZeRO saves under host offload on 2 and 3 ranks (issue 21 item 11): when the
pinned region cannot hold the host state gathered over the ranks (here the pinned budget,
MEGALITH_ASYNC_PINNED_MAX_BYTES, is below it), the save is written synchronously instead
of failing (zero_capture [Note: gathered host state when the pin fails]); its files equal
a synchronous save's and resuming from them continues exactly as the run did.

A capture that fails after the optimizer's states were captured (on the writing rank, or
on another rank only) gives the pinned region back: the next asynchronous save pins into
it again instead of waiting forever."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from megalith.testing import run_distributed

from .zero_offload_case import boosted
from .zero_offload_case import saved_tensors as _tensors
from .zero_offload_case import train_step as _step

CAP = 1000  # bytes of pinned memory a region may hold: less than the model's state
BOOM = "failed after the states were captured, on purpose"


def fallback_case(rank: int, root: str) -> dict:
    from megalith.booster.checkpoint_io import async_writes, pinned_pool
    from megalith.booster.checkpoint_io import zero as zero_io

    booster, model, optimizer = boosted()
    batches = [torch.randn(8, 16, generator=torch.Generator().manual_seed(10 * i + rank))
               for i in range(5)]  # fmt: skip

    def save(name: str, use_async: bool) -> None:
        booster.save_model(model, f"{root}/{name}/model", shard=True, use_async=use_async)
        booster.save_optimizer(optimizer, f"{root}/{name}/optim", shard=True, use_async=use_async)

    for x in batches[:2]:
        _step(booster, model, optimizer, x)
    tiers = sorted({c.tier for c in optimizer.zero_optimizer.trainable})
    save("sync", use_async=False)
    os.environ[pinned_pool.ENV] = str(CAP)
    save("async", use_async=True)
    pending_after_save = async_writes.pending()
    del os.environ[pinned_pool.ENV]
    after = [_step(booster, model, optimizer, x) for x in batches[2:]]
    async_writes.wait()
    pinned = {n: r.allocated for n, r in pinned_pool._regions.items()}

    booster2, model2, optimizer2 = boosted()
    booster2.load_model(model2, f"{root}/async/model")
    booster2.load_optimizer(optimizer2, f"{root}/async/optim")
    resumed = [_step(booster2, model2, optimizer2, x) for x in batches[2:]]

    # a capture failing after capture_states: on the writer (0), then on rank 1 only
    region = pinned_pool.region("optimizer")
    real = zero_io.hyperparameters
    errors, free_after = [], []
    for failing_rank in (0, 1):

        def failing(groups, failing_rank=failing_rank):
            if rank == failing_rank:
                raise RuntimeError(BOOM)
            return real(groups)

        zero_io.hyperparameters = failing
        try:
            booster.save_optimizer(optimizer, f"{root}/failed{failing_rank}", use_async=True)
            errors.append("")
        except RuntimeError as e:
            errors.append(str(e))
        zero_io.hyperparameters = real
        free_after.append(region._free.wait(timeout=5))
    save("later", use_async=True)
    async_writes.wait()
    result = {
        "tiers": tiers,
        "pending after save": pending_after_save,
        "pinned during fallback": pinned,
        "after": after,
        "resumed": resumed,
        "errors": errors,
        "free after failure": free_after,
        "later pinned": region.allocated,
    }
    if rank == 0:
        r = Path(root)
        for part in ("model", "optim"):
            sync, asyn = _tensors(r / "sync" / part), _tensors(r / "async" / part)
            result[f"{part} keys"] = len(sync) > 0 and sorted(sync) == sorted(asyn)
            result[f"{part} equal"] = all(sync[k].equal(asyn[k]) for k in sync)
            result[f"{part} nonzero"] = all(sync[k].abs().sum() > 0 for k in sync)
        result["later written"] = len(_tensors(r / "later" / "optim")) == len(
            _tensors(r / "sync" / "optim")
        )
    return result


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_gathered_host_state_over_the_pinned_budget_is_written_synchronously(tmp_path, world):
    results = run_distributed(fallback_case, world, str(tmp_path), timeout=110)
    for r in results:
        assert r["tiers"] == ["host"], f"cpu_offload no longer offloads to the host: {r}"
        assert r["pending after save"] == 0, "over the budget, yet queued as a background write"
        assert r["resumed"] == r["after"], r
        assert all(r["free after failure"]), f"a failed capture kept its pinned region: {r}"
        assert all(BOOM in e for e in r["errors"]), r["errors"]
    first = results[0]
    assert all(n == 0 for n in first["pinned during fallback"].values()), first
    for part in ("model", "optim"):
        assert first[f"{part} keys"] and first[f"{part} nonzero"], first
        assert first[f"{part} equal"], f"{part}: the fallback's files differ from the sync save's"
    assert first["later pinned"] > 0 and first["later written"], first
