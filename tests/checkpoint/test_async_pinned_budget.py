"""Asynchronous ZeRO saves under host offload never ask for more pinned memory than the
host can give (pinned_pool.budget): host state over the budget, or all of it when the
pin fails, is read in place and the next in-backward update (cpu_offload steps in
backward) waits for the writer. The files equal a synchronous save's while training goes
on over a slow disk. A capture that fails mid-save first lets the writes already queued
finish, so the failed save's temporary directory goes cleanly, the previous checkpoint
stays loadable and the error raised is the capture's own; one that fails after the
states were read in place lets the next update run (no write will read them)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from megalith.testing import run_distributed

from .zero_offload_case import boosted
from .zero_offload_case import saved_tensors as _tensors
from .zero_offload_case import train_step as _step

SLOW_WRITE_S = 0.2  # a slow disk: each checkpoint file takes at least this long
CAP = 1000  # bytes of pinned memory a region may hold: less than the model's state
BOOM = "capture failed on purpose"


def budget_case(rank: int, root: str) -> dict:
    import megalith_core.safetensors_files as files
    from megalith.booster.checkpoint_io import async_writes, pinned_pool, zero_capture
    from megalith.train import state

    booster, model, optimizer, scheduler = boosted(with_scheduler=True)
    batches = [torch.randn(8, 16, generator=torch.Generator().manual_seed(i)) for i in range(12)]
    for x in batches[:2]:
        _step(booster, model, optimizer, x)
    real_save, real_pin = files.atomic_save, pinned_pool._pin

    def slow(*args, **kwargs):
        time.sleep(SLOW_WRITE_S)
        return real_save(*args, **kwargs)

    def save(name: str, use_async: bool) -> None:
        booster.save_model(model, f"{root}/{name}/model", shard=True, use_async=use_async)
        booster.save_optimizer(optimizer, f"{root}/{name}/optim", shard=True, use_async=use_async)

    def async_round(name: str, x: list[torch.Tensor]) -> dict:
        """A sync save, then an async one on a slow disk while training steps on."""
        save(f"{name}-sync", use_async=False)
        files.atomic_save = slow
        zero_capture.last_step_wait_s = 0.0
        save(name, use_async=True)
        still_writing = async_writes.pending() > 0
        after = [_step(booster, model, optimizer, b) for b in x]
        waited = zero_capture.last_step_wait_s
        async_writes.wait()
        files.atomic_save = real_save
        out = {"still writing": still_writing, "waited": waited, "after": after}
        for part in ("model", "optim"):
            sync, asyn = (
                _tensors(Path(root, f"{name}-sync", part)),
                _tensors(Path(root, name, part)),
            )
            out[f"{part} keys"] = len(sync) > 0 and sorted(sync) == sorted(asyn)
            out[f"{part} equal"] = all(sync[k].equal(asyn[k]) for k in sync)
            out[f"{part} nonzero"] = all(sync[k].abs().sum() > 0 for k in sync)
        return out

    result = {"step_in_backward": bool(optimizer.zero_optimizer.step_in_backward)}
    # 1. a budget smaller than the state: none of it pinned, all read in place
    os.environ[pinned_pool.ENV] = str(CAP)
    result["capped"] = async_round("capped", batches[2:5])
    result["capped"]["pinned"] = [r.allocated for r in pinned_pool._regions.values()]
    del os.environ[pinned_pool.ENV]
    # resuming from the capped async checkpoint continues exactly as the run did
    booster2, model2, optimizer2, _ = boosted(with_scheduler=True)
    booster2.load_model(model2, f"{root}/capped/model")
    booster2.load_optimizer(optimizer2, f"{root}/capped/optim")
    result["resumed"] = [_step(booster2, model2, optimizer2, b) for b in batches[2:5]]

    # 2. the pin itself fails (as cudaHostAlloc does when the host is full)
    def refused(nbytes: int) -> torch.Tensor:
        raise RuntimeError("CUDA error: out of memory")

    pinned_pool._pin = refused
    result["pin failed"] = async_round("pinfail", batches[5:7])
    pinned_pool._pin = real_pin

    # 3. the optimizer's capture fails after the model's write was queued (slow disk)
    run = Path(root, "run")
    state.save(booster, model, optimizer, scheduler, run, 1, {}, use_async=True)
    state.wait_saves()
    previous = _tensors(run / "step_000001" / "model")
    _step(booster, model, optimizer, batches[7])
    real_capture = zero_capture.capture_states

    def failing(*args, **kwargs):
        raise RuntimeError(BOOM)

    files.atomic_save = slow
    zero_capture.capture_states = failing
    error = ""
    try:
        state.save(booster, model, optimizer, scheduler, run, 2, {}, use_async=True)
    except RuntimeError as e:
        error = str(e)
    zero_capture.capture_states = real_capture
    files.atomic_save = real_save
    later_error = ""
    try:
        state.wait_saves()
    except RuntimeError as e:
        later_error = str(e)
    found = state.find(run)
    booster3, model3, _, _ = boosted(with_scheduler=True)
    booster3.load_model(model3, str(found / "model"))
    booster3.save_model(model3, f"{root}/reloaded", shard=True)
    loaded = _tensors(Path(root, "reloaded"))
    state.save(booster, model, optimizer, scheduler, run, 3, {}, use_async=True)
    state.wait_saves()
    # 4. the capture fails after capture_states read the host state in place (a guard
    # on the next update) and pinned nothing: the update must not wait for a write
    from megalith.booster.checkpoint_io import zero as zero_io

    zopt = optimizer.zero_optimizer
    real_groups = zero_io.hyperparameters

    def failing_groups(groups):
        raise RuntimeError(BOOM)

    os.environ[pinned_pool.ENV] = str(CAP)
    zero_io.hyperparameters = failing_groups
    late_error = ""
    try:
        booster.save_optimizer(optimizer, f"{root}/late", shard=True, use_async=True)
    except RuntimeError as e:
        late_error = str(e)
    zero_io.hyperparameters = real_groups
    del os.environ[pinned_pool.ENV]
    guards = [getattr(h, "__self__", None) for h in zopt.step_pre_hooks]
    waiting = [
        g for g in guards if isinstance(g, zero_capture.InPlaceReads) and not g.done.is_set()
    ]
    result["late failure"] = {
        "error": late_error,
        "hooks waiting": len(waiting),
        "region free": pinned_pool.region("optimizer")._free.is_set(),
    }
    result["failed save"] = {
        "error": error,
        "later error": later_error,
        "tmp left": sorted(p.name for p in run.iterdir() if p.name.startswith(".tmp")),
        "found": found.name,
        "damage": str(state.damage(found)) if state.damage(found) else None,
        "loaded equal": sorted(loaded) == sorted(previous)
        and all(loaded[k].equal(previous[k]) for k in previous),
        "next save": (run / "step_000003" / state.COMPLETE).exists(),
    }
    return result


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("pinned_budget")
    return run_distributed(budget_case, 1, str(root), timeout=110)[0]


def _check_round(r: dict) -> None:
    assert r["still writing"], "the disk was not slow enough to overlap the steps"
    assert r["waited"] > 0.0, f"read in place, so the in-backward update must wait: {r}"
    for part in ("model", "optim"):
        assert r[f"{part} keys"] and r[f"{part} nonzero"], r
        assert r[f"{part} equal"], f"{part}: the async files differ from the sync save's"


@pytest.mark.timeout(120)
def test_a_budget_below_the_state_reads_it_in_place_and_equals_sync(result):
    assert result["step_in_backward"], "cpu_offload no longer steps in backward"
    _check_round(result["capped"])
    pinned = result["capped"]["pinned"]
    assert pinned and all(n == 0 for n in pinned), f"over the budget, yet pinned: {pinned}"
    assert result["resumed"] == result["capped"]["after"], result


@pytest.mark.timeout(120)
def test_a_refused_pin_falls_back_to_reading_in_place(result):
    _check_round(result["pin failed"])


@pytest.mark.timeout(120)
def test_a_capture_failing_after_its_in_place_reads_lets_the_next_update_run(result):
    r = result["late failure"]
    assert BOOM in r["error"], r
    assert r["hooks waiting"] == 0, f"the next update would wait for a write never queued: {r}"
    assert r["region free"], r


@pytest.mark.timeout(120)
def test_a_failed_capture_keeps_the_previous_checkpoint_and_raises_its_error(result):
    r = result["failed save"]
    assert BOOM in r["error"] and "use_async=False" in r["error"], r
    assert "No such file" not in r["error"] and r["later error"] == "", r
    assert r["tmp left"] == [], r
    assert r["found"] == "step_000001" and r["damage"] is None, r
    assert r["loaded equal"], "the previous checkpoint does not load its own values"
    assert r["next save"], "a save after the failure did not complete"
