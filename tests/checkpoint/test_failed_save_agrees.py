"""A synchronous ZeRO save whose writes fail on rank 0 (a full disk) fails on every rank
at once, naming the rank and the file, instead of leaving the other ranks in the save's
next collective until the timeout (issue 21, leftover B1)."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest
import torch

from megalith.testing import run_distributed

#: the collective timeout: far above what agreeing on the failure may take
TIMEOUT_S = 40


def _full_disk(tensors: dict, path: Path, *args, **kwargs) -> None:
    from megalith_core.atomic_files import write_error

    raise write_error(path, OSError(errno.ENOSPC, "No space left on device"))


def failed_save(rank: int, root: str, what: str) -> dict:
    import megalith_core.safetensors_files as files
    from megalith.booster import Booster, LowLevelZeroPlugin

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    booster = Booster(plugin=LowLevelZeroPlugin(stage=2, precision="fp32"))
    model, optimizer, *_ = booster.boost(model, optimizer)
    x = torch.randn(8, 16)
    booster.backward(model(x).square().mean(), optimizer)
    optimizer.step()
    if rank == 0:
        files.atomic_save = _full_disk  # rank 0's disk is full; the others' writes are none
    start = time.monotonic()
    try:
        if what == "model":
            booster.save_model(model, f"{root}/model", shard=True, size_per_shard=1)
        else:
            booster.save_optimizer(optimizer, f"{root}/optimizer", shard=True, size_per_shard=1)
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e), "took": time.monotonic() - start}
    return {"type": None, "message": "", "took": time.monotonic() - start}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("what", ["model", "optimizer"])
def test_a_failed_write_on_rank_0_fails_every_rank_promptly(tmp_path, what):
    results = run_distributed(
        failed_save,
        3,
        str(tmp_path),
        what,
        timeout=80,
        env={"MEGALITH_COMM_TIMEOUT": str(TIMEOUT_S)},
    )
    first = results[0]
    assert first["type"] == "OSError", first
    assert ".safetensors" in first["message"] and "is full" in first["message"], first
    for rank, r in enumerate(results[1:], start=1):
        assert r["type"] is not None, f"rank {rank} returned as if the save had worked"
        assert "failed on rank 0" in r["message"], r
        assert ".safetensors" in r["message"] and "is full" in r["message"], r
    for r in results:
        assert r["took"] < TIMEOUT_S / 4, f"the failure took {r['took']:.1f} s to reach a rank"
