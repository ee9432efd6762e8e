"""Bucketer: coalesced all-reduce and flat-sharded reduce-scatter, against per-tensor references."""

from __future__ import annotations

import pytest
import torch

import megalith_comm as comm
from megalith.testing import run_grid

SHAPES = [(3,), (4, 5), (7,), (2, 2, 2), (1,), (13,), (6, 1)]
DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.int64,
    torch.float32,
    torch.bfloat16,
    torch.float32,
    torch.int64,
]


def tensors(ws: int, rank: int, dtypes=DTYPES) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randint(-4, 5, s, generator=g).to(d) for s, d in zip(SHAPES, dtypes)]


def summed(ws: int, dtypes=DTYPES) -> list[torch.Tensor]:
    per_rank = [tensors(ws, r, dtypes) for r in range(ws)]
    return [sum(ts[i].double() for ts in per_rank) for i in range(len(SHAPES))]


def check_all_reduce(rank: int, ws: int) -> None:
    ts = tensors(ws, rank)
    b = comm.Bucketer(bucket_bytes=64, op="sum")
    for t in ts:
        b.add(t)
    assert b.launched >= 2, "full buckets must start before wait()"
    assert b.wait() == []
    for i, (t, want) in enumerate(zip(ts, summed(ws))):
        assert torch.equal(t.double(), want), (i, t, want)
    ts = tensors(ws, rank)
    comm.all_reduce_coalesced(ts, op="avg", bucket_bytes=1 << 20)
    for i, (t, want) in enumerate(zip(ts, summed(ws))):
        expect = want / ws if t.is_floating_point() else torch.trunc(want / ws)
        assert torch.equal(t, expect.to(t.dtype)), (i, t, expect)


def check_reduce_scatter(rank: int, ws: int, bucket_bytes: int) -> list:
    dtypes = [torch.float32] * len(SHAPES)
    ts = tensors(ws, rank, dtypes)
    before = [t.clone() for t in ts]
    shards = comm.reduce_scatter_coalesced(ts, op="sum", bucket_bytes=bucket_bytes)
    want = summed(ws, dtypes)
    covered = []
    for shard in shards:
        assert shard.stop - shard.start == shard.data.numel()
        for index, t_off, s_off, n in shard.pieces:
            got = shard.data[s_off : s_off + n].double()
            assert torch.equal(got, want[index].reshape(-1)[t_off : t_off + n]), (index, t_off)
            # written back into the tensor, only there
            assert torch.equal(ts[index].reshape(-1)[t_off : t_off + n].double(), got)
            covered.append((index, t_off, n))
    for i, t in enumerate(ts):
        mine = torch.zeros(t.numel(), dtype=torch.bool)
        for index, t_off, n in covered:
            if index == i:
                mine[t_off : t_off + n] = True
        assert torch.equal(t.reshape(-1)[~mine], before[i].reshape(-1)[~mine])
    return covered


def bucket_checks(rank: int, case: str):
    ws = comm.get_world().world_size
    if case == "all_reduce":
        return check_all_reduce(rank, ws)
    if case == "reduce_scatter_one_bucket":
        return check_reduce_scatter(rank, ws, 1 << 20)
    if case == "reduce_scatter_small_buckets":
        return check_reduce_scatter(rank, ws, 48)
    if case == "group_of_one":
        (mine,) = [g for g in comm.new_groups([[r] for r in range(ws)], "self") if g]
        ts = tensors(ws, rank)
        shards = comm.reduce_scatter_coalesced(ts[:1], group=mine)
        assert shards[0].pieces == [(0, 0, 0, ts[0].numel())]
        with pytest.raises(ValueError, match="mode="):
            comm.Bucketer(mode="gather")
        return None
    raise AssertionError(case)


CASES = ["all_reduce", "reduce_scatter_one_bucket", "reduce_scatter_small_buckets", "group_of_one"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world_size", [2, 3])
def test_bucketer(world_size):
    results = run_grid(bucket_checks, CASES, world_size, timeout=80)
    numels = [torch.Size(s).numel() for s in SHAPES]
    for case in (1, 2):  # every element is owned by exactly one rank
        owned = [[0] * n for n in numels]
        for covered in results[case]:
            for index, t_off, n in covered:
                for k in range(t_off, t_off + n):
                    owned[index][k] += 1
        assert all(c == 1 for row in owned for c in row), CASES[case]
