"""megalith.testing's ColossalAI surface (colossalai.testing): spawn with ranks that call
megalith.launch themselves, parameterize, reruns, state-dict and HF-output comparison,
seed_all, used the way ColossalAI's own tests use them."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import megalith
from megalith.testing import (
    DistributedTestError,
    DummyDataloader,
    assert_close_loose,
    assert_equal_in_group,
    assert_hf_output_close,
    assert_not_equal,
    check_state_dict_equal,
    clear_cache_before_run,
    parameterize,
    rerun_if_address_is_in_use,
    rerun_on_exception,
    run_on_environment_flag,
    seed_all,
    skip_if_not_enough_gpus,
    spawn,
)


def _sum_of_ranks(rank, world_size, port, scale):
    megalith.launch(rank=rank, world_size=world_size, host="localhost", port=port, backend="gloo")
    import torch.distributed as dist

    values = torch.randn(4, generator=torch.Generator().manual_seed(rank)) * scale
    total = values.clone()
    dist.all_reduce(total)
    expected = sum(
        torch.randn(4, generator=torch.Generator().manual_seed(r)) for r in range(world_size)
    )
    assert_close_loose(total, expected * scale)
    assert dist.get_world_size() == world_size and dist.get_rank() == rank
    assert_equal_in_group(total)


def _rank_one_fails(rank, world_size, port):
    megalith.launch(rank=rank, world_size=world_size, host="localhost", port=port, backend="gloo")
    if rank == 1:
        raise ValueError("rank one's own mistake")
    torch.distributed.barrier()


@pytest.mark.timeout(60)
def test_spawn_two_ranks_all_reduce_through_launch():
    spawn(_sum_of_ranks, nprocs=2, scale=3.0)


@pytest.mark.timeout(60)
def test_spawn_reports_the_failing_rank_with_its_traceback():
    with pytest.raises(DistributedTestError) as info:
        spawn(_rank_one_fails, 2)
    assert info.value.rank == 1
    assert "rank one's own mistake" in str(info.value) and "_rank_one_fails" in str(info.value)


def _sleeps(rank, world_size, port):
    import time

    time.sleep(60)


@pytest.mark.timeout(30)
def test_spawn_fails_a_hung_rank_after_megalith_spawn_timeout(monkeypatch):
    monkeypatch.setenv("MEGALITH_SPAWN_TIMEOUT", "2")
    with pytest.raises(DistributedTestError, match=r"timed out after 2 s; rank\(s\) \[0, 1\]"):
        spawn(_sleeps, 2)


def test_spawn_refuses_a_bad_nprocs():
    with pytest.raises(ValueError, match="nprocs=0"):
        spawn(_sum_of_ranks, 0)


def test_parameterize_runs_the_cross_product_with_keyword_arguments():
    seen = []

    @parameterize("a", [1, 2])
    @parameterize("b", ["x", "y", "z"])
    def record(a, b, tag):
        seen.append((a, b, tag))

    record(tag="t")
    assert seen == [(a, b, "t") for a in (1, 2) for b in "xyz"]
    assert record.__name__ == "record"


def test_rerun_on_exception_retries_matching_errors_only():
    calls = []

    @rerun_on_exception(RuntimeError, pattern="^flaky.*$", max_try=3)
    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("flaky port")
        return len(calls)

    assert flaky() == 3

    @rerun_on_exception(RuntimeError, pattern="^flaky.*$", max_try=3)
    def broken():
        calls.append(1)
        raise RuntimeError("a real bug")

    calls.clear()
    with pytest.raises(RuntimeError, match="a real bug"):
        broken()
    assert len(calls) == 1

    @rerun_if_address_is_in_use()
    def port_taken():
        calls.append(1)
        raise DistributedTestError("rank 0 raised: Address already in use")

    calls.clear()
    with pytest.raises(DistributedTestError):
        port_taken()
    assert len(calls) == 5


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(3, 4, generator=g),
        "state": {0: {"exp_avg": torch.randn(4, generator=g), "step": 7}},
        "param_groups": [{"lr": 0.1, "params": [0, 1]}],
        "buffers": [torch.randn(2, generator=g)],
    }


def test_check_state_dict_equal_accepts_copies_and_names_the_difference():
    check_state_dict_equal(_state(1), _state(1))
    check_state_dict_equal(
        _state(1), {**_state(1), "weight": _state(1)["weight"].double()}, ignore_dtype=True
    )
    changed = _state(1)
    changed["state"][0]["exp_avg"][2] += 0.5
    with pytest.raises(AssertionError, match="exp_avg"):
        check_state_dict_equal(_state(1), changed)
    changed = _state(1)
    changed["param_groups"][0]["lr"] = 0.2
    with pytest.raises(AssertionError, match="lr"):
        check_state_dict_equal(_state(1), changed)
    with pytest.raises(AssertionError, match="only in the second"):
        check_state_dict_equal(_state(1), {**_state(1), "extra": 1})
    assert_not_equal(_state(1)["weight"], _state(2)["weight"])


def test_assert_hf_output_close_skips_ignored_keys_and_names_the_path():
    out = {"logits": torch.randn(2, 3), "hidden": (torch.randn(2), torch.randn(2))}
    other = {"logits": out["logits"].clone(), "hidden": (out["hidden"][0], out["hidden"][1] + 1)}
    assert_hf_output_close(out, other, ignore_keys=["hidden"])
    with pytest.raises(AssertionError, match=r"\.hidden\.1"):
        assert_hf_output_close(out, other)


def test_seed_all_reproduces_python_numpy_and_torch():
    def draw():
        return random.random(), float(np.random.rand()), torch.randn(3)

    seed_all(1234)
    first = draw()
    seed_all(1234)
    second = draw()
    assert first[:2] == second[:2] and torch.equal(first[2], second[2])
    seed_all(4321)
    assert draw()[0] != first[0]


def test_dummy_dataloader_calls_the_generator_each_batch_and_restarts():
    loader = DummyDataloader(lambda: torch.randn(2), length=3)
    batches = list(loader)
    assert len(loader) == 3 and len(batches) == 3 and not torch.equal(batches[0], batches[1])
    assert len(list(loader)) == 3


def test_clear_cache_and_gpu_count_decorators_keep_the_call():
    @clear_cache_before_run()
    def doubled(x):
        return 2 * x

    assert doubled(21) == 42
    ran = []

    @skip_if_not_enough_gpus(min_gpus=10_000)
    def needs_many():
        ran.append(1)

    with pytest.raises(pytest.skip.Exception, match="needs 10000 GPUs"):
        needs_many()
    assert not ran


@run_on_environment_flag(name="MEGALITH_FLAG_NEVER_SET")
def test_run_on_environment_flag_skips_without_the_variable():
    raise AssertionError("ran although MEGALITH_FLAG_NEVER_SET is not 1")
