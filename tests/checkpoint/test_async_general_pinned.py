"""Asynchronous saves of GeneralCheckpointIO (TorchDDPPlugin): the writer's host copies go
into pinned regions reused from save to save (pinned_pool), not a buffer pinned per
tensor at each save; the files equal a synchronous save of the same state while
training steps on over a slow disk."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from megalith.testing import run_distributed
from tests.support.gpu import gpu

SLOW_WRITE_S = 0.2  # a slow disk: each checkpoint file takes at least this long


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def ddp_case(rank: int, root: str) -> dict | None:
    import megalith_core.safetensors_files as files
    from megalith.booster import Booster, TorchDDPPlugin
    from megalith.booster.checkpoint_io import async_writes, pinned_pool

    def per_tensor(t: torch.Tensor) -> torch.Tensor:
        raise AssertionError("an asynchronous save pinned a buffer per tensor")

    async_writes.snapshot = per_tensor
    import megalith_comm

    # the world's device: the GPU test's ranks run on CUDA, the CPU test's on CPU even
    # where a GPU is
    device = megalith_comm.get_world().device
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model.register_buffer("seen", torch.zeros(3))  # a persistent buffer goes too
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    booster = Booster(plugin=TorchDDPPlugin())
    model, optimizer, *_ = booster.boost(model.to(device), optimizer)
    torch.manual_seed(1 + rank)

    def step() -> None:
        loss = model(torch.randn(8, 16, device=device)).square().mean()
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        model.unwrap().seen.add_(1.0)

    def save(name: str, use_async: bool) -> None:
        booster.save_model(model, f"{root}/{name}/model", shard=True, use_async=use_async)
        booster.save_optimizer(optimizer, f"{root}/{name}/optim", shard=True, use_async=use_async)

    def pinned() -> int:
        return sum(r.allocated for r in pinned_pool._regions.values())

    step()
    save("sync", use_async=False)
    real = files.atomic_save

    def slow(*args, **kwargs):
        time.sleep(SLOW_WRITE_S)
        return real(*args, **kwargs)

    files.atomic_save = slow
    save("async", use_async=True)
    step()  # changes the parameters, states and buffer while the writer still writes
    step()
    async_writes.wait()
    files.atomic_save = real
    first = pinned()
    save("later", use_async=True)
    async_writes.wait()
    if rank != 0:
        return {"pinned": pinned()}
    r = Path(root)
    result = {"pinned first": first, "pinned later": pinned()}
    for part in ("model", "optim"):
        sync, asyn, later = (_tensors(r / n / part) for n in ("sync", "async", "later"))
        result[f"{part} keys"] = sorted(sync) == sorted(asyn) == sorted(later) and len(sync) > 1
        result[f"{part} equal"] = all(sync[k].equal(asyn[k]) for k in sync)
        result[f"{part} stepped"] = all(not sync[k].equal(later[k]) for k in sync)
    meta = [json.loads((r / n / "optim" / "optimizer.json").read_text()) for n in ("sync", "async")]
    result["optimizer.json equal"] = meta[0] == meta[1]
    return result


def _check(result: dict) -> None:
    for part in ("model", "optim"):
        assert result[f"{part} keys"], result
        assert result[f"{part} equal"], f"{part}: the async files differ from the sync save's"
        assert result[f"{part} stepped"], f"{part}: the later save holds the same values"
    assert result["optimizer.json equal"], result
    assert result["pinned first"] > 0, result
    assert result["pinned later"] == result["pinned first"], "the second save pinned more"


@pytest.mark.timeout(90)
def test_ddp_async_saves_reuse_pinned_regions_and_equal_sync(tmp_path):
    results = run_distributed(ddp_case, 2, str(tmp_path), timeout=80)
    _check(results[0])
    assert results[1] == {"pinned": 0}, "a rank that writes nothing copies nothing"


@gpu
@pytest.mark.timeout(90)
def test_ddp_async_saves_reuse_pinned_regions_on_gpu(tmp_path):
    _check(run_distributed(ddp_case, 1, str(tmp_path), timeout=80, backend="nccl")[0])
