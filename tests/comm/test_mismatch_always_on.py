"""The always-on mismatch check (MEGALITH_COMM_DEBUG unset): a shape, dtype or reduce-op
mismatch between ranks is named on every rank, never a SIGABRT inside Gloo, never silent."""

from __future__ import annotations

import pytest
import torch

import megalith_comm as comm
from megalith.testing import run_distributed
from megalith_comm import debug, mismatch

OFF = {"MEGALITH_COMM_DEBUG": "0"}


def _raises(fn) -> tuple[str, tuple[int, ...]]:
    with pytest.raises(comm.CollectiveMismatchError) as info:
        fn()
    return str(info.value), info.value.ranks


def _in_step(rank: int, world: int) -> float:
    """A correct collective on fresh values after a mismatch: the group goes on."""
    g = torch.Generator().manual_seed(1000 + rank)
    t = torch.randn(6, generator=g)
    want = sum(
        torch.randn(6, generator=torch.Generator().manual_seed(1000 + r)) for r in range(world)
    )
    comm.all_reduce(t)
    return float((t - want).abs().max())


def cpu_cases(rank: int) -> list:
    world = comm.get_world().world_size
    x = torch.randn(8, generator=torch.Generator().manual_seed(rank))
    out = [_raises(lambda: comm.all_reduce(x[:4] if rank == 1 else x.clone()))]
    dtype = torch.float64 if rank == 2 else torch.float32
    out.append(_raises(lambda: comm.all_reduce(x.to(dtype))))
    out.append(_raises(lambda: comm.all_reduce(x.clone(), op="max" if rank == 0 else "sum")))
    # Both shapes seen before, then rank 1 swaps them: still checked (Gloo would abort).
    for _ in range(3):
        comm.all_reduce(x.clone())
        comm.all_reduce(x[:4].clone())
    out.append(_raises(lambda: comm.all_reduce(x[:4].clone() if rank == 1 else x.clone())))
    # Rank 2 skips a barrier: its all_gather meets the others' barrier.
    gathered = torch.empty(8 * world)
    if rank != 2:
        out.append(_raises(lambda: comm.barrier()))
    else:
        out.append(_raises(lambda: comm.all_gather(gathered, x)))
    out.append(_in_step(rank, world))
    return out


@pytest.mark.timeout(60)
def test_cpu_mismatches_are_named_on_every_rank_with_debug_off():
    results = run_distributed(cpu_cases, 3, timeout=50, env=OFF)
    assert results[0][:5] == results[1][:5] == results[2][:5], "every rank raises the same error"
    texts = [t for t, _ in results[0][:5]]
    who = [r for _, r in results[0][:5]]
    assert (
        "rank 1 called all_reduce(shape [4], float32, op sum) but ranks 0, 2 called "
        "all_reduce(shape [8], float32, op sum)" in texts[0]
    )
    assert "group 'world'" in texts[0] and "always-on" in texts[0]
    assert "MEGALITH_COMM_DEBUG=1 checks each one" in texts[0], "the message names the fix"
    assert "rank 2 called all_reduce(shape [8], float64, op sum) but ranks 0, 1" in texts[1]
    assert "rank 0 called all_reduce(shape [8], float32, op max) but ranks 1, 2" in texts[2]
    assert "rank 1 called all_reduce(shape [4], float32, op sum)" in texts[3]
    assert (
        "rank 2 called all_gather(shape [8], float32) but ranks 0, 1 called barrier()" in texts[4]
    )
    assert who == [(1,), (2,), (0,), (1,), (2,)]
    for r in results:
        assert r[5] < 1e-5, f"after the mismatches a correct all_reduce is off by {r[5]}"


def _cuda_like(shape: list[int]) -> None:
    """What a CUDA collective tells the check (no NCCL launched: the check is on the host)."""
    g = comm.get_world().group
    debug.check(g, "all_reduce", dtype=torch.bfloat16, device="cuda", redop="sum", shape=shape)


def sampled_cases(rank: int) -> tuple[str, tuple[int, ...], int]:
    """CUDA collectives exchange only when new or every N-th: a mismatch between two
    exchanges is named at the next exchange, at the position where it happened."""
    g = comm.get_world().group
    for _ in range(3):  # warm up: both keys seen on every rank
        _cuda_like([8])
        _cuda_like([4])
    before = g.agreement.exchanges
    _cuda_like([4] if rank == 1 else [8])  # old keys on both sides: no exchange
    skipped = g.agreement.exchanges - before
    text, ranks = _raises(lambda: comm.all_reduce(torch.ones(3)))  # CPU: exchanges
    return text, ranks, skipped


@pytest.mark.timeout(60)
def test_sampled_cuda_mismatch_is_named_at_the_next_exchange():
    results = run_distributed(sampled_cases, 2, timeout=50, env=OFF)
    assert results[0][:2] == results[1][:2]
    text, ranks, skipped = results[0]
    assert skipped == 0, "an old key between periodic exchanges costs no exchange"
    assert "rank 1 called all_reduce(shape [4], bfloat16, cuda, op sum)" in text, text
    assert "collective #6 on the group" in text
    assert ranks == (1,)


def test_exchange_schedule():
    a = mismatch.Agreement("mesh0/dp", every=4)
    cuda = dict(dtype=torch.bfloat16, device="cuda", redop="sum", shape=torch.Size([1024]))
    other = dict(cuda, shape=torch.Size([512]))
    # new keys exchange; old ones only at every 4th position; CPU always
    plan = [a.note(p, "all_reduce", other if p == 5 else cuda) for p in range(1, 10)]
    assert plan == [True, False, False, True, True, False, False, True, False]
    assert a.note(10, "all_reduce", dict(cuda, device="cpu"))
    assert a.note(11, "barrier", {})
    b = mismatch.Agreement("mesh0/dp", every=4)
    for p in range(1, 10):
        b.note(p, "all_reduce", other if p == 5 else cuda)
    c = mismatch.Agreement("mesh0/dp", every=4)
    for p in range(1, 10):
        c.note(p, "all_reduce", cuda)
    d = mismatch.Agreement("mesh0/tp", every=4)
    assert b.digest != c.digest, "the digest covers every collective, exchanged or not"
    assert d.digest != mismatch.Agreement("mesh0/dp").digest, "the group is in the digest"


@pytest.mark.parametrize("value", ["0", "x", "65"])
def test_bad_period_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("MEGALITH_COMM_CHECK_EVERY", value)
    with pytest.raises(ValueError, match=r"MEGALITH_COMM_CHECK_EVERY=.*from 1 to 64"):
        mismatch.every_from_env()
