"""LowLevelZeroPlugin(cpu_offload=True) updates each chunk's host state during backward,
before step(): its asynchronous save copies that state rather than reading it in place
(zero_capture.in_place). The files equal a synchronous save of the same state while
training goes on over a slow disk, and resuming from them continues exactly as the run
that never stopped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from megalith.testing import run_distributed

from .zero_offload_case import boosted
from .zero_offload_case import saved_tensors as _tensors

SLOW_WRITE_S = 0.2  # a slow disk: each checkpoint file takes at least this long
STEPS_AFTER = 3


def offload_case(rank: int, root: str) -> dict:
    import megalith_core.safetensors_files as files
    from megalith.booster.checkpoint_io import async_writes, pinned_pool, zero_capture

    booster, model, optimizer = boosted()
    zopt = optimizer.zero_optimizer
    batches = [torch.randn(8, 16, generator=torch.Generator().manual_seed(10 * i + rank))
               for i in range(2 + STEPS_AFTER)]  # fmt: skip

    def step(model, optimizer, booster, x) -> float:
        loss = model(x).square().mean()
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        return float(loss)

    def save(name: str, use_async: bool) -> None:
        booster.save_model(model, f"{root}/{name}/model", shard=True, use_async=use_async)
        booster.save_optimizer(optimizer, f"{root}/{name}/optim", shard=True, use_async=use_async)

    for x in batches[:2]:
        step(model, optimizer, booster, x)
    save("sync", use_async=False)
    real = files.atomic_save

    def slow(*args, **kwargs):
        time.sleep(SLOW_WRITE_S)
        return real(*args, **kwargs)

    files.atomic_save = slow
    zero_capture.last_step_wait_s = 0.0
    save("async", use_async=True)
    still_writing = async_writes.pending() > 0
    # training goes on: each backward updates the host state the writer saved
    after = [step(model, optimizer, booster, x) for x in batches[2:]]
    waited = zero_capture.last_step_wait_s
    async_writes.wait()
    files.atomic_save = real
    first = sum(r.allocated for r in pinned_pool._regions.values())
    save("later", use_async=True)
    async_writes.wait()

    # resume from the async checkpoint: the same steps give the same losses
    booster2, model2, optimizer2 = boosted()
    booster2.load_model(model2, f"{root}/async/model")
    booster2.load_optimizer(optimizer2, f"{root}/async/optim")
    resumed = [step(model2, optimizer2, booster2, x) for x in batches[2:]]
    result = {
        "step_in_backward": bool(zopt.step_in_backward),
        "still_writing": still_writing,
        "waited": waited,
        "after": after,
        "resumed": resumed,
        "pinned first": first,
        "pinned later": sum(r.allocated for r in pinned_pool._regions.values()),
    }
    if rank == 0:
        r = Path(root)
        for part in ("model", "optim"):
            sync, asyn, later = (_tensors(r / n / part) for n in ("sync", "async", "later"))
            result[f"{part} keys"] = sorted(sync) == sorted(asyn) == sorted(later) and len(sync)
            result[f"{part} equal"] = all(sync[k].equal(asyn[k]) for k in sync)
            result[f"{part} stepped"] = any(not sync[k].equal(later[k]) for k in sync)
    return result


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 2])
def test_cpu_offload_async_saves_equal_sync_while_training_goes_on(tmp_path, world):
    results = run_distributed(offload_case, world, str(tmp_path), timeout=110)
    for result in results:
        assert result["step_in_backward"], "cpu_offload no longer steps in backward: see in_place"
        assert result["waited"] == 0.0, "copied, not read in place: the step never waits"
        assert result["resumed"] == result["after"], result
    first = results[0]
    assert first["still_writing"], "the disk was not slow enough to overlap the steps"
    for part in ("model", "optim"):
        assert first[f"{part} keys"], first
        assert first[f"{part} equal"], f"{part}: the async files differ from the sync save's"
        assert first[f"{part} stepped"], f"{part}: the later save holds the same values"
    assert first["pinned first"] > 0 and first["pinned later"] == first["pinned first"], first
