"""ZeRO's asynchronous capture (zero_capture.py): whole chunks copied into pinned regions
reused from save to save, and host-offloaded state read in place with the next step
waiting for the writer. What the writer writes equals a synchronous save of the same
state even when training steps on while a slow disk is still being written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from megalith.testing import run_distributed

#: a slow disk: each checkpoint file takes at least this long
SLOW_WRITE_S = 0.3


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def capture_case(rank: int, root: str, offload: bool) -> dict | None:
    import megalith_core.safetensors_files as files
    from megalith.booster import Booster, LowLevelZeroPlugin
    from megalith.booster.checkpoint_io import async_writes, pinned_pool, zero_capture

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    plugin = LowLevelZeroPlugin(stage=2, precision="fp32", cpu_offload=offload)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)
    torch.manual_seed(1 + rank)

    def step() -> None:
        booster.backward(model(torch.randn(8, 16)).square().mean(), optimizer)
        optimizer.step()
        optimizer.zero_grad()

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
    zero_capture.last_step_wait_s = 0.0
    save("async", use_async=True)
    step()  # changes the parameters and states the writer may still be reading
    waited = zero_capture.last_step_wait_s
    async_writes.wait()
    files.atomic_save = real
    first = pinned()
    save("later", use_async=True)
    async_writes.wait()
    if rank != 0:
        return None
    r = Path(root)
    result = {"waited": waited, "pinned first": first, "pinned later": pinned()}
    for part in ("model", "optim"):
        sync, asyn, later = (_tensors(r / n / part) for n in ("sync", "async", "later"))
        result[f"{part} keys"] = sorted(sync) == sorted(asyn) == sorted(later) and len(sync) > 0
        result[f"{part} equal"] = all(sync[k].equal(asyn[k]) for k in sync)
        result[f"{part} stepped"] = any(not sync[k].equal(later[k]) for k in sync)
    return result


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "world, offload",
    # LowLevelZero's cpu_offload steps chunks in backward, so its host state is copied
    # too (zero_capture.in_place): the in-place read has no case here yet
    [(1, True), (1, False), (2, False)],
    ids=["host-offload-copies", "one-rank-copies", "gathered-copies"],
)
def test_async_capture_writes_the_state_of_the_save(tmp_path, world, offload):
    result = run_distributed(capture_case, world, str(tmp_path), offload, timeout=80)[0]
    for part in ("model", "optim"):
        assert result[f"{part} keys"], result
        assert result[f"{part} equal"], f"{part}: the async files differ from the sync save's"
        assert result[f"{part} stepped"], f"{part}: the later save holds the same values"
    # copied: the step never waits; the second save reuses the first one's memory
    assert result["waited"] == 0.0, result
    assert result["pinned first"] > 0, result
    assert result["pinned later"] == result["pinned first"], result
