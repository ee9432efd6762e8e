"""Stage 3 with ZeroConfig(keep_gathered_bytes): chunks stay gathered from forward to
backward under a budget ([Note: kept chunks] in megalith_zero/stage3.py).

- The numbers do not change: losses and weights equal stage 3 without it, bit for bit.
- Gathers fall: with room for every chunk, each is gathered once a step (forward only).
- The budget holds, and what stays is what backward needs first: after forward, every
  kept chunk was used later in forward than every chunk that was freed.
"""

from __future__ import annotations

import pytest
import torch

import megalith_comm as comm
from megalith.testing import run_grid
from tests.zero import toy

STEPS = 6
CHUNK = 2048


def keep_run(rank: int, keep: int | str):
    import megalith_zero as zero
    from megalith_zero.chunk import FlatChunk

    gathers = [0]
    plain_gather = FlatChunk.gather

    def counting_gather(self, group):
        handle = plain_gather(self, group)
        gathers[0] += handle is not None
        return handle

    FlatChunk.gather = counting_gather
    try:
        model = toy.make_model(0)
        opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
        budget = 1 << 40 if keep == "all" else int(keep) * CHUNK
        zmodel, zopt = zero.shard(
            model,
            opt,
            zero.ZeroConfig(stage=3, chunk_bytes=CHUNK, keep_gathered_bytes=budget if keep else 0),
        )
        hooks = zmodel.stage3
        losses, per_step, kept_ok, kept_bytes = [], [], [], 0
        rows = slice(
            rank * toy.BATCH // zmodel.group.size, (rank + 1) * toy.BATCH // zmodel.group.size
        )
        for (x, y), *_ in toy.batches(0, STEPS, 1):
            before = gathers[0]
            loss = toy.loss_fn(zmodel, x[rows], y[rows])
            # between forward and backward: the kept chunks are the latest forward used
            used = hooks._last_use
            gathered = {c.spec.index for c in zmodel.chunks if c.is_gathered}
            freed = [k for k in used if k not in gathered]
            kept = [k for k in hooks._kept]
            kept_bytes = max(kept_bytes, sum(zmodel.chunks[k].full.numel() * 4 for k in kept))
            kept_ok.append(
                all(used[k] > used[f] for k in kept for f in freed) if kept and freed else True
            )
            zopt.backward(loss)
            zopt.step()
            zopt.zero_grad()
            per_step.append(gathers[0] - before)
            total = loss.detach().double()
            comm.all_reduce(total, op="avg", group=zmodel.group)
            losses.append(float(total))
        params = {k: v.clone() for k, v in zmodel.full_state_dict().items()}
        out = dict(
            losses=losses,
            params=params,
            gathers=per_step[1:],  # after the step that records the order
            kept_ok=kept_ok,
            kept_bytes=kept_bytes,
            budget=budget,
            chunks=sum(1 for c in zmodel.chunks),
        )
    finally:
        FlatChunk.gather = plain_gather
    return out if rank == 0 else None


@pytest.mark.parametrize("world_size", [2, 3])
def test_kept_chunks_change_nothing_but_the_gathers(world_size):
    base, everything, two = (
        r[0] for r in run_grid(keep_run, [0, "all", 2], world_size, timeout=240)
    )
    for run in (everything, two):
        assert run["losses"] == base["losses"]
        for name, ref in base["params"].items():
            assert torch.equal(run["params"][name], ref), name
    # with room for all, a chunk is gathered once a step; without, again for backward
    assert all(g <= everything["chunks"] for g in everything["gathers"]), everything["gathers"]
    assert all(g > everything["chunks"] for g in base["gathers"]), base["gathers"]
    assert all(
        b > t >= e for b, t, e in zip(base["gathers"], two["gathers"], everything["gathers"])
    )
    # the budget of two chunks holds, and what it keeps is the tail of the forward
    assert 0 < two["kept_bytes"] <= two["budget"]
    assert all(two["kept_ok"]), two["kept_ok"]


def test_keep_gathered_bytes_needs_stage_3():
    import megalith_zero as zero

    with pytest.raises(ValueError, match="only stage 3"):
        zero.ZeroConfig(stage=2, keep_gathered_bytes=1 << 20)
    with pytest.raises(ValueError, match="expected >= 0"):
        zero.ZeroConfig(stage=3, keep_gathered_bytes=-1)
