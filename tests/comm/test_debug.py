"""Debug mode (MEGALITH_COMM_DEBUG=1): mismatched collectives fail on every rank, naming who differs."""

from __future__ import annotations

import pytest
import torch

import megalith_comm as comm
from megalith.testing import run_distributed
from megalith_comm import debug


def mismatch(fn) -> tuple[str, tuple[int, ...]]:
    with pytest.raises(comm.CollectiveMismatchError) as info:
        fn()
    return str(info.value), info.value.ranks


def debug_cases(rank: int) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    n = 4 if rank == 1 else 8
    out.append(mismatch(lambda: comm.all_reduce(torch.zeros(n))))
    dtype = torch.float64 if rank == 2 else torch.float32
    out.append(mismatch(lambda: comm.all_reduce(torch.zeros(8, dtype=dtype))))
    if rank == 0:
        out.append(mismatch(lambda: comm.broadcast(torch.zeros(8), src=0)))
    else:
        out.append(mismatch(lambda: comm.all_reduce(torch.zeros(8))))
    out.append(mismatch(lambda: comm.broadcast(torch.zeros(3), src=min(rank, 1))))
    out.append(mismatch(lambda: comm.all_reduce(torch.zeros(3), op="max" if rank else "sum")))
    # all_to_all: rank 0 sends 2 rows to rank 1, which expects 1
    send = [1, 2, 1] if rank == 0 else [1, 1, 1]
    recv = [1, 1, 1]
    out.append(
        mismatch(
            lambda: comm.all_to_all(torch.zeros(sum(recv)), torch.zeros(sum(send)), recv, send)
        )
    )
    # the group is still in step: a correct collective works
    t = torch.ones(2)
    comm.all_reduce(t)
    assert t.tolist() == [3.0, 3.0]
    return out


@pytest.mark.timeout(90)
def test_mismatches_are_named_on_every_rank():
    results = run_distributed(debug_cases, 3, timeout=80, env={"MEGALITH_COMM_DEBUG": "1"})
    assert results[0] == results[1] == results[2], "every rank must raise the same error"
    texts = [text for text, _ in results[0]]
    who = [ranks for _, ranks in results[0]]
    assert (
        "rank 1 called all_reduce(shape [4], float32, op sum) but ranks 0, 2 called "
        "all_reduce(shape [8], float32, op sum)" in texts[0]
    )
    assert "group 'world'" in texts[0] and "MEGALITH_COMM_DEBUG=1" in texts[0]
    assert "rank 2 called all_reduce(shape [8], float64, op sum) but ranks 0, 1" in texts[1]
    assert (
        "rank 0 called broadcast(shape [8], float32, src 0) but ranks 1, 2 called "
        "all_reduce(shape [8], float32, op sum)" in texts[2]
    )
    assert "rank 0 called broadcast(shape [3], float32, src 0) but ranks 1, 2 called" in texts[3]
    assert "src 1" in texts[3]
    assert "rank 0 called all_reduce(shape [3], float32, op sum)" in texts[4]
    assert "rank 0 sends 2 rows to rank 1, which expects 1 rows from it" in texts[5]
    assert who[:5] == [(1,), (2,), (0,), (0,), (0,)] and who[5] == (0, 1)


def test_signature_text_and_majority():
    sig = debug.encode(4, "reduce_scatter", dtype=torch.bfloat16, redop="avg", sizes=[3, 3, 2, 2])
    assert debug.describe(sig.tolist(), 4) == "reduce_scatter(sizes [3, 3, 2, 2], bfloat16, op avg)"
    a = debug.encode(4, "all_gather", dtype=torch.int64, shape=[2, 5]).tolist()
    b = debug.encode(4, "all_gather", dtype=torch.int64, shape=[2, 6]).tolist()
    text, ranks = debug.mismatch_message("mesh/dp", [0, 2, 4, 6], [a, b, a, b])
    # a tie goes to the side with the lowest rank
    assert text.endswith(
        "ranks 2, 6 called all_gather(shape [2, 6], int64) but ranks 0, 4 called "
        "all_gather(shape [2, 5], int64)"
    )
    assert ranks == (2, 6)
    assert debug.mismatch_message("g", [0, 1], [a, a]) is None


@pytest.mark.parametrize(("value", "on"), [("1", True), ("on", True), ("0", False), ("", False)])
def test_enabled(monkeypatch, value, on):
    monkeypatch.setenv("MEGALITH_COMM_DEBUG", value)
    assert debug.enabled() is on
