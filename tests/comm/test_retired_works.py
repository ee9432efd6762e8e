"""[Note: Gloo works outlive their wait] (megalith_comm/handle.py): the last works a rank
waited for stay referenced by the main thread, so that a Gloo worker thread never frees
their tensors itself while the interpreter finalizes; destroy() drops them."""

from __future__ import annotations

import torch

import megalith_comm as comm
from megalith.testing import run_distributed
from megalith_comm import handle


def _keeps_then_drops(rank: int) -> tuple[bool, float, int]:
    world = comm.get_world().world_size
    # drawn per rank so the sum checks real values; nothing else references t afterwards
    t = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    want = sum(torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(world))
    h = comm.all_reduce(t, async_op=True)
    h.wait()
    kept = [w for w in handle._retired if isinstance(w, torch.distributed.Work)]
    ok = bool(kept) and kept[-1] is h._works[-1]
    err = float((t - want).abs().max())
    for _ in range(2 * handle.RETIRED_WORKS):  # bounded: the oldest go first
        comm.all_reduce(torch.ones(4))
    return ok, err, len(handle._retired)


def test_waited_works_are_kept_and_bounded():
    for ok, err, kept in run_distributed(_keeps_then_drops, 3, timeout=60):
        assert ok, "the waited work is not among the kept ones"
        assert err < 1e-5, err
        assert kept == handle.RETIRED_WORKS, kept


def test_destroy_drops_the_kept_works(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    comm.init()  # world size 1: its collectives are local, so keep a stand-in
    handle._retired.append(object())
    comm.destroy()
    assert not handle._retired
