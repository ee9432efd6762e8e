"""Point-to-point send/recv: tensors, tuples and lists; metadata sent once and renegotiated."""

from __future__ import annotations

import pytest
import torch

import megalith_comm as comm
from megalith.testing import run_distributed
from megalith_comm import p2p


def counted(fn):
    before = dict(p2p.STATS)
    out = fn()
    return out, {k: p2p.STATS[k] - before[k] for k in before}


def p2p_checks(rank: int) -> dict:
    seen = {}
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t2 = (torch.ones(2, 3), torch.arange(4), torch.full((1, 1), 2.5, dtype=torch.bfloat16))
    if rank == 0:
        _, seen["first"] = counted(lambda: comm.send(a, dst=1))
        _, seen["same"] = counted(lambda: comm.send(a + 1, dst=1))
        _, seen["changed"] = counted(lambda: comm.send(torch.ones(5, dtype=torch.bfloat16), dst=1))
        _, seen["after"] = counted(lambda: comm.send(torch.zeros(5, dtype=torch.bfloat16), dst=1))
        for i in range(2):  # two tags, two caches
            comm.send(torch.full((2,), float(i)), dst=2, tag=0)
            comm.send((torch.full((3,), float(i)), torch.ones(1, dtype=torch.int64)), dst=2, tag=7)
        with pytest.raises(ValueError, match="dst=0 is this rank"):
            comm.send(a, dst=0)
        with pytest.raises(TypeError, match="expected a tensor or a tuple/list"):
            comm.send({"a": a}, dst=1)
    elif rank == 1:
        got, seen["first"] = counted(lambda: comm.recv(src=0))
        assert torch.equal(got, a)
        got, seen["same"] = counted(lambda: comm.recv(src=0))
        assert torch.equal(got, a + 1)
        got, seen["changed"] = counted(lambda: comm.recv(src=0))
        assert got.dtype == torch.bfloat16 and torch.equal(got, torch.ones(5, dtype=torch.bfloat16))
        got, seen["after"] = counted(lambda: comm.recv(src=0))
        assert torch.equal(got, torch.zeros(5, dtype=torch.bfloat16))
        comm.send(t2, dst=2)
        comm.send(tuple(x * 2 for x in t2), dst=2)
        comm.send([t2[0]], dst=2)
    else:
        got, seen["tuple"] = counted(lambda: comm.recv(src=1))
        assert isinstance(got, tuple) and all(torch.equal(x, y) for x, y in zip(got, t2))
        assert [x.dtype for x in got] == [torch.float32, torch.int64, torch.bfloat16]
        got, seen["tuple again"] = counted(lambda: comm.recv(src=1))
        assert all(torch.equal(x, y * 2) for x, y in zip(got, t2))
        got, seen["list"] = counted(lambda: comm.recv(src=1))
        assert isinstance(got, list) and torch.equal(got[0], t2[0])
        for i in range(2):
            x = comm.recv(src=0, tag=0)
            y = comm.recv(src=0, tag=7)
            assert torch.equal(x, torch.full((2,), float(i)))
            assert torch.equal(y[0], torch.full((3,), float(i))) and y[1].item() == 1
    # a subgroup: global ranks, as everywhere
    mesh = comm.Mesh(None, {"x": 3})
    if rank == 2:
        comm.send(torch.tensor([42]), dst=0, group=mesh.group("x"))
    elif rank == 0:
        assert comm.recv(src=2, group=mesh.group("x")).item() == 42
    return seen


@pytest.mark.timeout(90)
def test_send_recv_structures_and_metadata_cache():
    seen = run_distributed(p2p_checks, 3, timeout=80)
    once = {"metadata_sent": 1, "metadata_received": 0}
    never = {"metadata_sent": 0, "metadata_received": 0}
    assert seen[0] == {"first": once, "same": never, "changed": once, "after": never}
    got = {"metadata_sent": 0, "metadata_received": 1}
    assert seen[1] == {"first": got, "same": never, "changed": got, "after": never}
    assert seen[2] == {"tuple": got, "tuple again": never, "list": got}


def early_receives(rank: int) -> dict:
    """recv(async_op=True) posted before the peer sends: SAME, a smaller tensor (CHANGED,
    as a pipeline's last micro-batch) and a tuple, each posted after the previous wait."""
    messages = [
        torch.arange(6.0),
        torch.arange(6.0) + 1,
        torch.arange(4.0),
        (torch.ones(2), torch.arange(3)),
    ]
    seen = {}
    if rank == 0:
        comm.send(torch.zeros(6), dst=1)  # structure cached at both ends
        for i, message in enumerate(messages):
            comm.barrier()  # the receiver has posted
            _, seen[i] = counted(lambda m=message: comm.send(m, dst=1, async_op=True).wait())
        return seen
    comm.recv(src=0)
    for i, message in enumerate(messages):
        handle = comm.recv(src=0, async_op=True)
        comm.barrier()
        got, seen[i] = counted(handle.wait)
        expected = message if isinstance(message, tuple) else (message,)
        got = got if isinstance(got, tuple) else (got,)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), (i, got)
    return seen


@pytest.mark.timeout(90)
def test_early_receive_follows_structure_changes():
    sent, received = run_distributed(early_receives, 2, timeout=80)
    never, once = (
        {"metadata_sent": 0, "metadata_received": 0},
        {"metadata_sent": 1, "metadata_received": 0},
    )
    assert sent == {0: never, 1: never, 2: once, 3: once}
    got = {"metadata_sent": 0, "metadata_received": 1}
    assert received == {0: never, 1: never, 2: got, 3: got}


def same_sends_make_no_tensor(rank: int) -> int | None:
    """A send of a cached structure creates no tensor (on CUDA: no host-to-device copy)."""
    if rank == 1:
        for _ in range(4):
            comm.recv(src=0)
        return None
    a = torch.ones(5)
    comm.send(a, dst=1)
    comm.send(a, dst=1)  # the first SAME message makes the device's SAME header
    made = []
    real = torch.tensor
    torch.tensor = lambda *args, **kw: made.append(args) or real(*args, **kw)
    try:
        comm.send(a, dst=1)
        comm.send(a + 1, dst=1, async_op=True).wait()
    finally:
        torch.tensor = real
    assert p2p._same_header(a.device) is p2p._same_header(a.device)
    return len(made)


@pytest.mark.timeout(60)
def test_same_structure_send_creates_no_tensor():
    assert run_distributed(same_sends_make_no_tensor, 2, timeout=50)[0] == 0
