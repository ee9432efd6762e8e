"""megalith_comm on CUDA tensors (the engine's NCCL communicator) against the CPU (Gloo) path.

Each rank runs every collective twice on the same data, once on CPU tensors (Gloo)
and once on CUDA tensors (NCCL), and the results must match exactly (small integer
inputs). Needs one GPU per rank: skipped otherwise (run_distributed backend="nccl").
"""

from __future__ import annotations

import pytest
import torch

import megalith_comm as comm
from megalith.testing import gpus_for, run_distributed
from tests.comm.test_collectives import inputs

DTYPES = (torch.float32, torch.bfloat16, torch.int64)


def same(cpu: torch.Tensor, gpu: torch.Tensor, what: str) -> None:
    assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu), f"{what}: {gpu.cpu()} != {cpu}"


def gpu_vs_cpu(rank: int) -> bool:
    world = comm.get_world()
    ws, dev = world.world_size, world.device
    assert dev.type == "cuda"
    for dtype in DTYPES:
        # avg on integers is NCCL's definition; compare the float ops only
        for op in ("sum", "min", "max", "prod") + (("avg",) if dtype.is_floating_point else ()):
            x = inputs(ws, (7,), dtype, seed=1, op=op)[rank]
            cpu, gpu = x.clone(), x.to(dev)
            comm.all_reduce(cpu, op=op)
            comm.all_reduce(gpu, op=op)
            same(cpu, gpu, f"all_reduce {op} {dtype}")
        x = inputs(ws, (ws * 3,), dtype, seed=2)[rank]
        out_c, out_g = torch.empty(3, dtype=dtype), torch.empty(3, dtype=dtype, device=dev)
        comm.reduce_scatter(out_c, x)
        comm.reduce_scatter(out_g, x.to(dev))
        same(out_c, out_g, "reduce_scatter")
        sizes = [len(range(10)[i::ws]) for i in range(ws)]
        x = inputs(ws, (10,), dtype, seed=3)[rank]
        pieces = list(torch.split(x, sizes))
        out_c, out_g = (
            torch.empty(sizes[rank], dtype=dtype),
            torch.empty(sizes[rank], dtype=dtype, device=dev),
        )
        comm.reduce_scatter(out_c, pieces)
        comm.reduce_scatter(out_g, [p.to(dev) for p in pieces])
        same(out_c, out_g, "reduce_scatter uneven")
        outs_c = [torch.empty(s, dtype=dtype) for s in sizes]
        outs_g = [torch.empty(s, dtype=dtype, device=dev) for s in sizes]
        comm.all_gather(outs_c, pieces[rank])
        comm.all_gather(outs_g, pieces[rank].to(dev))
        for c, g in zip(outs_c, outs_g):
            same(c, g, "all_gather uneven")
        b_c, b_g = x.clone(), x.to(dev)
        comm.broadcast(b_c, src=ws - 1)
        comm.broadcast(b_g, src=ws - 1)
        same(b_c, b_g, "broadcast")
        rows = [(rank + j) % 3 for j in range(ws)]
        recv = [(i + rank) % 3 for i in range(ws)]
        x = inputs(ws, (sum(rows), 2), dtype, seed=4)[rank]
        a_c = torch.empty(sum(recv), 2, dtype=dtype)
        a_g = torch.empty(sum(recv), 2, dtype=dtype, device=dev)
        comm.all_to_all(a_c, x, recv, rows)
        comm.all_to_all(a_g, x.to(dev), recv, rows)
        same(a_c, a_g, "all_to_all uneven")
    # on a side stream, async: ordered after the stream's earlier work
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):
        t = torch.full((1 << 16,), float(rank + 1), device=dev)
        handle = comm.all_reduce(t, async_op=True)
        handle.wait()
        t.mul_(2)
    side.synchronize()
    assert t[0].item() == t[-1].item() == 2.0 * ws * (ws + 1) / 2
    # p2p of a tuple, and the bucketer, on CUDA
    if rank == 0:
        comm.send((torch.ones(3, device=dev), torch.arange(4, device=dev)), dst=1)
    elif rank == 1:
        a, b = comm.recv(src=0)
        assert a.is_cuda and a.sum().item() == 3 and b.tolist() == [0, 1, 2, 3]
    ts = [torch.full((n,), float(rank), device=dev) for n in (3, 100, 7)]
    comm.all_reduce_coalesced(ts, bucket_bytes=256)
    assert all(t.eq(ws * (ws - 1) / 2).all().item() for t in ts)
    return True


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.skipif(not gpus_for(2), reason="needs 2 CUDA GPUs")
def test_cuda_tensors_through_nccl_match_gloo():
    assert run_distributed(gpu_vs_cpu, 2, timeout=170, backend="nccl") == [True, True]


def identity_on_one_gpu(rank: int) -> list:
    dev = comm.get_world().device
    t = torch.arange(4.0, device=dev)
    comm.all_reduce(t, op="avg")
    out = torch.empty(4, device=dev)
    comm.all_gather(out, t)
    return out.tolist()


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(not gpus_for(1), reason="needs a CUDA GPU")
def test_world_of_one_gpu_is_the_identity():
    assert run_distributed(identity_on_one_gpu, 1, timeout=100, backend="nccl") == [[0, 1, 2, 3]]


def side_stream_results_on_one_gpu(rank: int) -> list[str]:
    """Collectives issued on a side stream behind slow work, waited for on the current
    stream, then read there at once: the wait must order the read after the result."""
    dev = comm.get_world().device
    side = torch.cuda.Stream(dev)
    wrong = []
    n = 1 << 22
    for name in ("all_gather", "reduce_scatter", "all_to_all", "all_reduce", "broadcast"):
        src = torch.randn(n, device=dev)
        dst = torch.full((n,), float("nan"), device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            torch.cuda._sleep(100_000_000)  # tens of ms of side-stream work first
            if name in ("all_reduce", "broadcast"):
                dst.copy_(src)  # written on the side stream, like a bucket's staging
                args = (dst,) if name == "all_reduce" else (dst, 0)
            else:
                args = (dst, src)
            handle = getattr(comm, name)(*args, async_op=True)
        handle.wait()
        if not torch.equal(dst, src):  # read on the current stream
            wrong.append(name)
        torch.cuda.synchronize(dev)
    return wrong


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(not gpus_for(1), reason="needs a CUDA GPU")
def test_one_rank_collective_on_a_side_stream_orders_the_waiter():
    # ZeRO-3 gathers on a side stream; at world 1 a gather is a local copy, and its
    # handle once ordered nothing, so forward read half-copied parameters (seen as
    # losses that drifted from ZeRO-2's on one H200).
    assert run_distributed(side_stream_results_on_one_gpu, 1, timeout=100, backend="nccl") == [[]]
