"""megalith_comm collectives on CPU ranks (Gloo) against numpy references.

World sizes 2, 3 and 4 (3 makes uneven shards); fp32, bf16 and int64. Inputs are
small integers so that sums and products are exact in every dtype; every rank
rebuilds every other rank's input from its seed and checks its own result. One
process group per world size runs every check (run_grid), with debug mode on (it
must not object to correct calls, uneven ones included).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import megalith_comm as comm
from megalith.testing import run_grid

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}
OPS = ("sum", "avg", "min", "max", "prod")


def inputs(ws: int, shape, dtype: torch.dtype, seed: int, op: str = "sum") -> list[torch.Tensor]:
    """Rank r's input, reproducible on every rank; prod uses +-1, +-2 so products stay exact."""
    out = []
    for r in range(ws):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        if op == "prod":
            x = torch.tensor([-2, -1, 1, 2])[torch.randint(0, 4, shape, generator=g)]
        else:
            x = torch.randint(-4, 5, shape, generator=g)
        out.append(x.to(dtype))
    return out


def reference(xs: list[torch.Tensor], op: str) -> np.ndarray:
    a = np.stack([x.double().numpy() for x in xs])
    if op == "avg":
        s = a.sum(0)
        return s / len(xs) if xs[0].is_floating_point() else np.trunc(s / len(xs))
    return {"sum": a.sum, "min": a.min, "max": a.max, "prod": a.prod}[op](0)


def expect(got: torch.Tensor, want: np.ndarray, what: str) -> None:
    want_t = torch.from_numpy(np.ascontiguousarray(want)).to(got.dtype).reshape(got.shape)
    assert torch.equal(got, want_t), f"{what}: got {got.tolist()} want {want_t.tolist()}"


def check_all_reduce(rank, ws, dtype):
    for i, op in enumerate(OPS):
        xs = inputs(ws, (7,), dtype, seed=i, op=op)
        t = xs[rank].clone()
        comm.all_reduce(t, op=op)
        expect(t, reference(xs, op), f"all_reduce {op}")
    # non-contiguous (a transposed view), and async
    xs = inputs(ws, (3, 5), dtype, seed=10)
    base = xs[rank].t().contiguous()
    view = base.t()
    assert not view.is_contiguous()
    comm.all_reduce(view, op="sum")
    expect(view, reference(xs, "sum"), "all_reduce non-contiguous")
    xs = inputs(ws, (6,), dtype, seed=11)
    t = xs[rank].clone()
    handle = comm.all_reduce(t, op="max", async_op=True)
    assert isinstance(handle, comm.Handle)
    handle.wait()
    expect(t, reference(xs, "max"), "all_reduce async")


def check_reduce_scatter(rank, ws, dtype):
    n = 5
    for i, op in enumerate(("sum", "avg", "max", "prod")):
        xs = inputs(ws, (ws * n,), dtype, seed=20 + i, op=op)
        out = torch.empty(n, dtype=dtype)
        handle = comm.reduce_scatter(out, xs[rank], op=op, async_op=(op == "max"))
        if handle is not None:
            handle.wait()
        expect(out, reference(xs, op)[rank * n : (rank + 1) * n], f"reduce_scatter {op}")
    # uneven shards: 10 elements over ws ranks, list form
    sizes = [len(c) for c in np.array_split(np.arange(10), ws)]
    for i, op in enumerate(("sum", "min", "avg")):
        xs = inputs(ws, (10,), dtype, seed=30 + i, op=op)
        pieces = list(torch.split(xs[rank], sizes))
        out = torch.empty(sizes[rank], dtype=dtype)
        comm.reduce_scatter(out, pieces, op=op)
        lo = sum(sizes[:rank])
        expect(out, reference(xs, op)[lo : lo + sizes[rank]], f"reduce_scatter list {op}")
    # the flat form refuses sizes that are not output * world size, with the numbers
    bad = torch.zeros(10, dtype=dtype)
    with pytest.raises(ValueError) as info:
        comm.reduce_scatter(torch.empty(3, dtype=dtype), bad)
    if 3 * ws != 10:
        assert f"input has 10 elements but output (3) * group size ({ws}) = {3 * ws}" in str(
            info.value
        )


def check_all_gather(rank, ws, dtype):
    xs = inputs(ws, (2, 3), dtype, seed=40)
    out = torch.empty(ws * 2, 3, dtype=dtype)
    comm.all_gather(out, xs[rank])
    expect(out, np.concatenate([x.double().numpy() for x in xs]), "all_gather")
    # uneven pieces through the list form
    sizes = [len(c) for c in np.array_split(np.arange(10), ws)]
    xs = inputs(ws, (10,), dtype, seed=41)
    mine = torch.split(xs[rank], sizes)[rank]
    outs = [torch.empty(s, dtype=dtype) for s in sizes]
    comm.all_gather(outs, mine, async_op=True).wait()
    for r in range(ws):
        expect(outs[r], torch.split(xs[r], sizes)[r].double().numpy(), f"all_gather list [{r}]")
    with pytest.raises(ValueError, match=r"output has 7 elements but input \(2\) \* group size"):
        comm.all_gather(torch.empty(7, dtype=dtype), torch.empty(2, dtype=dtype))


def check_broadcast_and_reduce(rank, ws, dtype):
    for src in range(ws):
        xs = inputs(ws, (4,), dtype, seed=50 + src)
        t = xs[rank].clone()
        comm.broadcast(t, src=src)
        expect(t, xs[src].double().numpy(), f"broadcast from {src}")
    for dst in range(ws):
        for op in ("sum", "avg", "min"):
            xs = inputs(ws, (5,), dtype, seed=60 + dst)
            t = xs[rank].clone()
            comm.reduce(t, dst=dst, op=op)
            if rank == dst:
                expect(t, reference(xs, op), f"reduce {op} to {dst}")
    with pytest.raises(ValueError, match=rf"src={ws} is not a rank of group 'world'"):
        comm.broadcast(torch.zeros(1, dtype=dtype), src=ws)


def check_all_to_all(rank, ws, dtype):
    # even: 2 rows per peer
    xs = inputs(ws, (2 * ws, 3), dtype, seed=70)
    out = torch.empty(2 * ws, 3, dtype=dtype)
    comm.all_to_all(out, xs[rank])
    want = np.concatenate([xs[r][2 * rank : 2 * rank + 2].double().numpy() for r in range(ws)])
    expect(out, want, "all_to_all")
    # uneven: rank i sends (i + j) % 3 rows to rank j (some zero)
    rows = [[(i + j) % 3 for j in range(ws)] for i in range(ws)]
    xs = [inputs(ws, (sum(rows[i]), 2), dtype, seed=71)[i] for i in range(ws)]
    recv_rows = [rows[i][rank] for i in range(ws)]
    out = torch.empty(sum(recv_rows), 2, dtype=dtype)
    comm.all_to_all(out, xs[rank], output_split_sizes=recv_rows, input_split_sizes=rows[rank])
    want = [torch.split(xs[i], rows[i])[rank].double().numpy() for i in range(ws)]
    expect(out, np.concatenate(want), "all_to_all uneven")
    with pytest.raises(ValueError, match=rf"input has {2 * ws + 1} rows \(dim 0\), not divisible"):
        comm.all_to_all(torch.empty(2 * ws + 1, dtype=dtype), torch.empty(2 * ws + 1, dtype=dtype))


def collective_checks(rank: int, dtype_name: str) -> str:
    ws = comm.get_world().world_size
    dtype = DTYPES[dtype_name]
    check_all_reduce(rank, ws, dtype)
    check_reduce_scatter(rank, ws, dtype)
    check_all_gather(rank, ws, dtype)
    check_broadcast_and_reduce(rank, ws, dtype)
    check_all_to_all(rank, ws, dtype)
    comm.barrier()
    return dtype_name


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_collectives_match_numpy(world_size):
    env = {"MEGALITH_COMM_DEBUG": "1"}
    results = run_grid(collective_checks, list(DTYPES), world_size, timeout=100, env=env)
    assert results == [[name] * world_size for name in DTYPES]
