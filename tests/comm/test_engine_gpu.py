"""The engine's NCCL communicator (megalith._engine.NcclCommunicator) on CUDA tensors.

World size 1 on one GPU: every op against torch, ordering on a side stream, groups,
abort, and the watchdog timing out an op held back on its stream. Two processes when
two GPUs are present (tests/_comm_pair.py): every op against references computed
locally, and a rank that skips an all_reduce. Skipped without a GPU or NCCL.
"""

from __future__ import annotations

import re
import time

import pytest
import torch

from megalith import _engine
from tests.comm.pair import find_nccl, run_pair
from tests.support.gpu import gpu, has_cuda_engine

NCCL_READY = has_cuda_engine() and find_nccl() and _engine.nccl_available()
needs_nccl = pytest.mark.skipif(
    not NCCL_READY, reason="needs libnccl (pip install nvidia-nccl-cu13)"
)
pytestmark = [gpu, needs_nccl]

DTYPES = [torch.float32, torch.bfloat16, torch.int64]
SIZES = [1, 7, 1000, 4097]


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def _input(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype).cuda()
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype).cuda()


@pytest.fixture
def comm():
    c = _engine.NcclCommunicator(_engine.nccl_unique_id(), 1, 0, 0, timeout_s=60.0, name="t-ws1")
    yield c
    del c


def test_version_and_unique_id():
    assert re.fullmatch(r"\d+\.\d+\.\d+", _engine.nccl_version())
    uid = _engine.nccl_unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128
    assert uid != _engine.nccl_unique_id()


def test_properties(comm):
    assert (comm.rank, comm.size, comm.device, comm.name) == (0, 1, 0, "t-ws1")
    assert comm.error() is None
    assert "t-ws1" in repr(comm)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_op_matches_torch(comm, dtype, n):
    x = _input(n, dtype)
    ops = ["sum", "min", "max", "prod"] + (["avg"] if dtype.is_floating_point else [])
    for op in ops:  # one rank: every reduction is the input itself
        y = torch.zeros_like(x)
        comm.all_reduce(x, y, op=op, stream=_stream()).synchronize()
        torch.testing.assert_close(y, x, rtol=0, atol=0)
    z = x.clone()
    comm.all_reduce(z, z, stream=_stream()).synchronize()  # in place
    torch.testing.assert_close(z, x, rtol=0, atol=0)

    y = torch.zeros_like(x)
    comm.reduce_scatter(x, y, op="sum", stream=_stream()).synchronize()
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    y = torch.zeros_like(x)
    comm.all_gather(x, y, stream=_stream()).synchronize()
    torch.testing.assert_close(y, torch.cat([x]), rtol=0, atol=0)
    b = x.clone()
    comm.broadcast(b, root=0, stream=_stream()).synchronize()
    torch.testing.assert_close(b, x, rtol=0, atol=0)
    y = torch.zeros_like(x)
    comm.reduce(x, y, root=0, op="max", stream=_stream()).synchronize()
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    y = torch.zeros_like(x)
    comm.all_to_all(x, y, stream=_stream()).synchronize()
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    y = torch.zeros_like(x)
    comm.all_to_allv(x, [n], y, [n], stream=_stream()).synchronize()
    torch.testing.assert_close(y, x, rtol=0, atol=0)

    y = torch.zeros_like(x)  # a send to oneself needs its recv in the same group
    comm.group_start()
    s = comm.send(x, peer=0, stream=_stream())
    r = comm.recv(y, peer=0, stream=_stream())
    comm.group_end()
    r.synchronize()
    assert s.is_completed()
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    comm.barrier(stream=_stream()).synchronize()


def test_empty_tensors(comm):
    e = torch.empty(0, device="cuda")
    w = comm.all_reduce(e, e, stream=_stream())
    w.synchronize()
    assert w.is_completed()


def test_arguments_are_checked_before_nccl(comm):
    x = torch.ones(8, device="cuda")
    with pytest.raises(ValueError, match=r"all_reduce: send must be a CUDA array"):
        comm.all_reduce(torch.ones(8), x)
    with pytest.raises(TypeError, match=r"all_reduce: recv is float64 but send is float32"):
        comm.all_reduce(x, torch.ones(8, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match=r"recv has 7 elements, expected 8"):
        comm.all_reduce(x, torch.ones(7, device="cuda"))
    with pytest.raises(ValueError, match=r"reduce_scatter: send has 8 elements, expected 3"):
        comm.reduce_scatter(x, torch.ones(3, device="cuda"))
    with pytest.raises(ValueError, match=r"all_gather: recv has 9 elements, expected 8"):
        comm.all_gather(x, torch.ones(9, device="cuda"))
    with pytest.raises(ValueError, match=r"contiguous"):
        comm.broadcast(torch.ones(8, 2, device="cuda").t(), root=0)
    with pytest.raises(ValueError, match=r"'avg' is not defined for int64"):
        comm.all_reduce(x.long(), x.long(), op="avg")
    with pytest.raises(ValueError, match=r"unknown reduction 'mul'"):
        comm.all_reduce(x, x, op="mul")
    with pytest.raises(ValueError, match=r"root 1 is not a rank"):
        comm.broadcast(x, root=1)
    with pytest.raises(ValueError, match=r"peer 0 is this rank"):
        comm.send(x, peer=0)
    with pytest.raises(ValueError, match=r"send_counts sum to 7 elements but send has 8"):
        comm.all_to_allv(x, [7], x.clone(), [8])
    with pytest.raises(ValueError, match=r"overlap"):
        comm.all_reduce(x[:6], x[2:])
    assert comm.error() is None  # refused calls leave the communicator usable
    comm.all_reduce(x, x).synchronize()


def test_side_stream_ordering(comm):
    """An op on a side stream runs after the side stream's earlier work; Work.wait orders main."""
    n = 1 << 22
    x = torch.zeros(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25 ms: a race would read the zeros
        x.fill_(3.0)
    work = comm.all_reduce(x, y, stream=side.cuda_stream)
    work.wait(_stream())  # main waits on the device, the host does not block
    out = y * 2  # on the main stream
    assert torch.all(out == 6.0)
    assert work.is_completed()


def test_group_of_many_small_all_reduces(comm):
    xs = [_input(17, torch.float32, seed=i) for i in range(200)]
    ys = [torch.zeros_like(x) for x in xs]
    comm.group_start()
    works = [comm.all_reduce(x, y, stream=_stream()) for x, y in zip(xs, ys)]
    assert not works[0].is_completed()  # nothing launched before group_end
    with pytest.raises(ValueError, match="group_end"):
        works[0].synchronize()
    comm.group_end()
    for w in works:
        w.synchronize()
    for x, y in zip(xs, ys):
        torch.testing.assert_close(y, x, rtol=0, atol=0)


def test_abort_then_the_next_call_raises_naming_the_communicator():
    c = _engine.NcclCommunicator(_engine.nccl_unique_id(), 1, 0, 0, name="t-abort")
    x = torch.ones(16, device="cuda")
    c.all_reduce(x, x).synchronize()
    c.abort()
    assert "'t-abort'" in c.error()
    with pytest.raises(RuntimeError, match=r"'t-abort' \(rank 0 of 1\)"):
        c.all_reduce(x, x)
    with pytest.raises(RuntimeError, match="t-abort"):
        c.barrier()


@pytest.mark.timeout(120)
def test_watchdog_fails_an_op_held_back_past_the_timeout():
    c = _engine.NcclCommunicator(_engine.nccl_unique_id(), 1, 0, 0, timeout_s=2.0, name="t-slow")
    x = torch.ones(1024, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(14_000_000_000)  # ~7 s at 2 GHz: the all_reduce queues behind it
    t0 = time.monotonic()
    work = c.all_reduce(x, x, stream=side.cuda_stream)
    with pytest.raises(RuntimeError) as info:
        work.synchronize()
    waited = time.monotonic() - t0
    text = str(info.value)
    assert waited < 5.0, text
    assert "all_reduce on 't-slow' (rank 0 of 1, 1024 x float32)" in text
    assert "did not finish within 2.0 s" in text
    assert c.error() is not None
    with pytest.raises(RuntimeError, match="t-slow"):
        c.all_reduce(x, x)
    torch.cuda.synchronize()
    del c


@pytest.mark.timeout(120)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_ranks_every_op(tmp_path):
    run_pair("every_op", tmp_path)


@pytest.mark.timeout(120)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_ranks_watchdog_names_the_op_when_a_rank_skips_it(tmp_path):
    run_pair("skip", tmp_path)
